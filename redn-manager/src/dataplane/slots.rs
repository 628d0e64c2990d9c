//! Which session makes room when an app is at `max_remote_clients`: the idle rule
//! (`evict_idle_after`), the address rule (no address keeps every slot from the others) and
//! the tenure rule (`evict_held_after`: under contention sessions take turns), with what
//! bars an address from the last two. `Dataplane::serve` asks
//! [`Dataplane::make_room`]; `Dataplane::hello` carries the eviction out once the
//! newcomer's instance is installed.

use super::{Dataplane, Manager};
use crate::auditor::AppKey;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The session that makes room for a newcomer ([`Dataplane::make_room`]).
pub(super) struct Eviction {
    /// Its connection's token.
    pub(super) session: usize,
    /// Why, for its `remote-exit` record.
    pub(super) why: String,
    /// Taken by the address or the tenure rule (not for idling): the newcomer's address is
    /// remembered in [`Dataplane::address_wins`].
    by_rule: bool,
    /// Taken by the tenure rule: until when the evicted session's address may not take a
    /// slot by that rule ([`Dataplane::tenure_losses`]).
    loser_barred_until: Option<Instant>,
}

/// How long an address that took a slot by the address or the tenure rule and gave it up
/// may not take another by those rules, counted from the first: a client that says hello,
/// hangs up and says hello again would otherwise evict a busy session at every turn.
pub(super) const ADDRESS_WIN_HOLD: Duration = Duration::from_secs(60);

impl Dataplane {
    /// The session of app `app` (its rule's number) that makes room for a newcomer at
    /// `newcomer`, the app being at `max_remote_clients` and its rule saying
    /// `evict_idle_after` (`idle_after`) and `evict_held_after` (`held_after`); or why none
    /// does, for the refusal. In order:
    ///
    /// 1. the one idle longest (no trigger counted by the auditor), if for at least
    ///    `idle_after`;
    /// 2. when addresses hold at least two sessions more than the newcomer's, the idlest
    ///    session of those holding the most, so that no address keeps every slot from the
    ///    others by keeping its sessions busy enough (after the swap it still holds as many
    ///    as the newcomer's, so they do not take turns);
    /// 3. the session held longest, if for at least `held_after`, of an address holding more
    ///    than the newcomer's, so that no party keeps every slot for ever from as many
    ///    addresses (each session held that long under contention; they take turns); not
    ///    for an address whose session gave a slot up by this rule less than `held_after`
    ///    ago ([`Self::tenure_losses`]), so that the evicted client's next hello does not
    ///    evict the next session in a chain through every slot.
    ///
    /// Rules 2 and 3 not for an address that gave up what it took by them within
    /// [`ADDRESS_WIN_HOLD`] ([`Self::rule_barred`]), so that it cannot take turns with
    /// itself.
    pub(super) fn make_room(
        &self,
        app: AppKey,
        idle_after: Option<Duration>,
        held_after: Option<Duration>,
        newcomer: IpAddr,
        manager: &Manager,
    ) -> Result<Eviction, String> {
        /// A session of the app: its token, address, idle time and time held.
        struct Held {
            token: usize,
            addr: IpAddr,
            idle: Duration,
            held: Duration,
        }
        let now = Instant::now();
        let sessions: Vec<Held> = self
            .conns
            .iter()
            .filter_map(|(t, c)| {
                let i = c.instance.as_ref().filter(|i| i.app_key == app)?;
                let ages = manager.remote_ages(i.handle, *t as u64, now)?;
                Some(Held {
                    token: *t,
                    addr: c.peer.ip(),
                    idle: ages.idle,
                    held: ages.held,
                })
            })
            .collect();
        // Ties go to the older connection, whatever the addresses are: an attacker picks
        // its addresses, not its connection's token.
        let most = |of: &mut dyn Iterator<Item = &Held>, by: fn(&Held) -> Duration| {
            of.max_by_key(|s| (by(s), std::cmp::Reverse(s.token)))
                .map(|s| (s.token, by(s)))
        };
        let mut why_not = Vec::new();
        if let Some(after) = idle_after {
            let idle = |s: &Held| s.idle;
            if let Some((t, idle)) = most(&mut sessions.iter().filter(|s| s.idle >= after), idle) {
                let why = format!(
                    "idle for {:.1}s, its slot taken by a new client",
                    idle.as_secs_f64()
                );
                return Ok(Eviction {
                    session: t,
                    why,
                    by_rule: false,
                    loser_barred_until: None,
                });
            }
            why_not.push(format!("none of them idle for {after:?}"));
        }
        if self.rule_barred(app, newcomer, now) {
            why_not.push(format!(
                "your address gave up a slot it took from another client less than \
                 {ADDRESS_WIN_HOLD:?} ago"
            ));
            return Err(why_not.join(", "));
        }
        // Counted once: a hello at the limit must not cost the event loop the square of the
        // app's sessions (up to the data plane's 4,096 connections).
        let mut per_addr: HashMap<IpAddr, usize> = HashMap::new();
        for s in &sessions {
            *per_addr.entry(s.addr).or_default() += 1;
        }
        let count = |a: IpAddr| per_addr.get(&a).copied().unwrap_or(0);
        let mine = count(newcomer);
        let n = per_addr.values().copied().max().unwrap_or(0);
        if n >= mine + 2 {
            // Every address holding the most is a candidate alike.
            let idle = |s: &Held| s.idle;
            if let Some((t, _)) = most(&mut sessions.iter().filter(|s| count(s.addr) == n), idle) {
                let why = format!(
                    "its address held {n} of the app's {} sessions; a client at another \
                     address took one",
                    sessions.len()
                );
                return Ok(Eviction {
                    session: t,
                    why,
                    by_rule: true,
                    loser_barred_until: None,
                });
            }
        }
        why_not.push("no address holding two more than yours".to_owned());
        let Some(after) = held_after else {
            return Err(why_not.join(", "));
        };
        if self
            .tenure_losses
            .get(&(app, newcomer))
            .is_some_and(|until| now < *until)
        {
            why_not.push(format!(
                "your address gave up a slot held for {after:?} to a newcomer less than \
                 {after:?} ago"
            ));
            return Err(why_not.join(", "));
        }
        let held = |s: &Held| s.held;
        let mut past = sessions
            .iter()
            .filter(|s| s.held >= after && count(s.addr) > mine);
        if let Some((t, held)) = most(&mut past, held) {
            let why = format!(
                "held its slot for {:.1}s, past the app's evict_held_after ({after:?}); a new \
                 client took it",
                held.as_secs_f64()
            );
            return Ok(Eviction {
                session: t,
                why,
                by_rule: true,
                // A session held `after`, so it fits the clock; checked all the same (a
                // policy may say 500 million years).
                loser_barred_until: now.checked_add(after),
            });
        }
        why_not.push(format!(
            "none held for {after:?} by an address holding more sessions than yours"
        ));
        Err(why_not.join(", "))
    }

    /// Eviction `e` of app `app` was carried out, for the newcomer `winner` (its session and
    /// address) and from the address `loser`: remember what bars them from the rules later
    /// ([`Self::rule_barred`], [`Dataplane::tenure_losses`]), dropping what has run out.
    pub(super) fn remember(
        &mut self,
        e: &Eviction,
        app: AppKey,
        winner: Option<(usize, IpAddr)>,
        loser: Option<IpAddr>,
    ) {
        let now = Instant::now();
        if let (true, Some((session, addr))) = (e.by_rule, winner) {
            self.address_wins.retain(|_, wins| {
                wins.retain(|(_, at)| now.duration_since(*at) < ADDRESS_WIN_HOLD);
                !wins.is_empty()
            });
            self.address_wins
                .entry((app, addr))
                .or_default()
                .push((session, now));
        }
        if let (Some(until), Some(loser)) = (e.loser_barred_until, loser) {
            self.tenure_losses.retain(|_, until| *until > now);
            self.tenure_losses.insert((app, loser), until);
        }
    }

    /// True if `addr` took a slot of app `app` by the address or the tenure rule less than
    /// [`ADDRESS_WIN_HOLD`] ago and no longer holds it: any such slot, not only its last
    /// (an address that keeps its newest win and gives up the one before would otherwise
    /// take turns with itself).
    pub(super) fn rule_barred(&self, app: AppKey, addr: IpAddr, now: Instant) -> bool {
        let Some(wins) = self.address_wins.get(&(app, addr)) else {
            return false;
        };
        wins.iter().any(|&(session, at)| {
            let held = self.conns.get(&session).is_some_and(|c| {
                c.peer.ip() == addr && c.instance.as_ref().is_some_and(|i| i.app_key == app)
            });
            !held && now.duration_since(at) < ADDRESS_WIN_HOLD
        })
    }
}
