//! The manager's install path is all or nothing, counted in NIC objects (with
//! `redn_sys::fault::FailingNic`): an install that
//! fails at any NIC call (the parking side's or the program's), or is refused before
//! reaching the NIC, leaves the NIC holding exactly what it held; an uninstall, a kill
//! and a disconnect under `keep_serving_after_exit = false` release everything.

use redn_client::kv::TwoChoiceTable;
use redn_manager::state::{Limits, Manager};
use redn_policy::PeerIdentity;
use redn_proto::api;
use redn_proto::errors::ManagerError;
use redn_sys::fault::FailingNic;
use redn_sys::nic::Nic;
use redn_sys::softnic::SoftNic;
use std::sync::Arc;

fn me() -> PeerIdentity {
    PeerIdentity {
        uid: 1000,
        gid: 1000,
        pid: std::process::id(),
        exe: "/usr/bin/kvstore".into(),
        cgroup: "/kv.service".into(),
        start_time: 1,
    }
}

fn manager(nic: Arc<FailingNic<SoftNic>>, wqes_per_invocation: u32, keep: bool) -> Manager {
    let policy = redn_policy::parse_policy(
        &format!(
            "[[app]]\nname = \"kv\"\nuid = 1000\noffloads = [\"hash-get\", \"echo\"]\n\
             max_regions = 4\nmax_pinned = \"1M\"\nmax_queues = 8\nmax_remote_clients = 4\n\
             keep_serving_after_exit = {keep}\n[app.client]\nrate_limit_kbps = 1000000\n\
             wqes_per_second = \"2M\"\nwqes_per_invocation = {wqes_per_invocation}\n\
             on_violation = \"terminate\"\n"
        ),
        "policy.toml",
    )
    .unwrap();
    let offloads = redn_policy::shipped_offloads()
        .unwrap()
        .into_iter()
        .map(|s| s.program)
        .collect();
    Manager::new(
        "policy.toml".into(),
        policy,
        offloads,
        nic,
        "softnic".into(),
        Limits::default(),
    )
}

fn failing_nic() -> Arc<FailingNic<SoftNic>> {
    Arc::new(FailingNic::new(SoftNic::with_pus(1).unwrap()))
}

/// A registered two-choice table and the hash-get request binding it.
fn table(m: &mut Manager, client: u64) -> (TwoChoiceTable, api::InstallOffload) {
    let t = TwoChoiceTable::create(64).unwrap();
    let fd = t.region().fd().try_clone_to_owned().unwrap();
    let r = m.register_region(client, fd).unwrap();
    let regions = t
        .bindings(r.region)
        .iter()
        .map(|&(name, region, offset, len)| api::Binding {
            name: name.into(),
            region,
            offset,
            len,
        })
        .collect();
    let req = api::InstallOffload {
        offload: "hash-get".into(),
        regions,
        parameters: None,
    };
    (t, req)
}

#[test]
fn a_failure_at_any_nic_call_of_an_install_leaves_nothing_behind() {
    let nic = failing_nic();
    let mut m = manager(Arc::clone(&nic), 64, true);
    let client = m.connect(me());
    let (_t, req) = table(&mut m, client);
    let before = nic.objects();
    let mut failures = 0;
    for fail_at in 0.. {
        nic.arm(fail_at);
        match m.install(client, req.clone()) {
            Err(e) => {
                assert!(
                    matches!(e, ManagerError::NoDevice { ref reason } if reason.contains("injected")),
                    "{e:?}"
                );
                assert_eq!(
                    nic.objects(),
                    before,
                    "objects left by a failure at NIC call {fail_at}"
                );
                assert_eq!(m.installed_count(), 0);
                failures += 1;
            }
            Ok(installed) => {
                nic.arm(usize::MAX);
                let after = nic.objects();
                // Parking side: a PD, a key, a CQ and a queue pair; the program's two PDs,
                // queues, CQs (with its master's) and keys.
                assert!(after.pds == before.pds + 3, "{before:?} -> {after:?}");
                assert!(after.qps > before.qps + 1 && after.cqs > before.cqs + 1);
                assert!(after.regions > before.regions + 4);
                m.uninstall(client, installed.handle).unwrap();
                assert_eq!(nic.objects(), before, "the uninstall released everything");
                break;
            }
        }
    }
    assert!(
        failures > 10,
        "every NIC call of the install was failed once ({failures})"
    );
}

#[test]
fn refusals_before_the_nic_create_nothing_on_it() {
    let nic = failing_nic();
    let mut m = manager(Arc::clone(&nic), 4, true);
    let client = m.connect(me());
    let (_t, req) = table(&mut m, client);
    let before = nic.objects();
    assert!(matches!(
        m.install(client, req.clone()),
        Err(ManagerError::VerifierRefused { .. })
    ));
    let mut unbound = req.clone();
    unbound.regions.pop();
    assert!(matches!(
        m.install(client, unbound),
        Err(ManagerError::InvalidParameter { .. })
    ));
    let mut other = req;
    other.offload = "list-find".into();
    assert!(matches!(
        m.install(client, other),
        Err(ManagerError::PolicyDenied { .. })
    ));
    assert_eq!(nic.objects(), before);
}

#[test]
fn queue_quota_counts_what_the_client_already_holds() {
    let nic = failing_nic();
    let mut m = manager(Arc::clone(&nic), 64, true);
    let client = m.connect(me());
    let (_t, req) = table(&mut m, client);
    // hash-get takes 2 queues plus its master: two installs fit in 8, a third does not.
    m.install(client, req.clone()).unwrap();
    m.install(client, req.clone()).unwrap();
    let before = nic.objects();
    let e = m.install(client, req).unwrap_err();
    assert_eq!(
        e,
        ManagerError::QuotaExceeded {
            resource: "queues".into(),
            limit: 8,
            requested: 9
        }
    );
    assert_eq!(nic.objects(), before);
}

#[test]
fn a_disconnect_keeps_or_releases_offloads_as_the_rule_says() {
    for keep in [true, false] {
        let nic = failing_nic();
        let mut m = manager(Arc::clone(&nic), 64, keep);
        let before = nic.objects();
        let client = m.connect(me());
        let (_t, req) = table(&mut m, client);
        m.install(client, req).unwrap();
        assert_eq!(m.disconnect(client), usize::from(!keep));
        if keep {
            assert_eq!(m.installed_count(), 1);
            assert_ne!(nic.objects(), before);
            assert_eq!(m.admin_kill(client).unwrap().uninstalled, 1);
        }
        assert_eq!(m.installed_count(), 0);
        assert_eq!(nic.objects(), before, "keep = {keep}");
    }
}

#[test]
fn the_data_plane_seam_answers_only_to_the_offloads_token() {
    let nic = failing_nic();
    let mut m = manager(Arc::clone(&nic), 64, true);
    let client = m.connect(me());
    let (_t, req) = table(&mut m, client);
    let installed = m.install(client, req).unwrap();
    let token: redn_policy::Token = installed.token.parse().unwrap();
    let spec = m
        .remote_client_spec(installed.handle, &token)
        .expect("the right token");
    assert_eq!(spec.program.name, "hash-get");
    let mut names: Vec<&str> = spec.data_bindings.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["table", "values"]);
    assert!(!spec.limit.is_unlimited());
    let mut bytes = *token.as_bytes();
    bytes[31] ^= 1;
    let wrong = redn_policy::Token::from_bytes(bytes);
    assert!(m.remote_client_spec(installed.handle, &wrong).is_none());
    assert!(m
        .remote_client_spec(installed.handle + 1000, &token)
        .is_none());
}

#[test]
fn a_restarted_app_takes_over_what_its_closed_connection_left_serving() {
    let nic = failing_nic();
    let mut m = manager(Arc::clone(&nic), 64, true);
    let before = nic.objects();
    let first = m.connect(me());
    let (_t, req) = table(&mut m, first);
    let installed = m.install(first, req).unwrap();
    assert_eq!(m.disconnect(first), 0, "kept serving");
    // Another uid is another app: it sees nothing.
    let stranger = m.connect(PeerIdentity { uid: 1001, ..me() });
    assert!(m.uninstall(stranger, installed.handle).is_err());
    let again = m.connect(PeerIdentity {
        pid: me().pid + 1,
        start_time: 2,
        ..me()
    });
    assert_eq!(m.adopt(stranger), 0);
    assert_eq!(m.adopt(again), 1);
    let stats = m.stats(again).unwrap();
    assert_eq!(stats.offloads.len(), 1);
    assert_eq!(stats.offloads[0].handle, installed.handle);
    assert_eq!(m.info(again).unwrap().regions, 1, "the region came along");
    m.uninstall(again, installed.handle).unwrap();
    m.disconnect(again);
    m.disconnect(stranger);
    assert_eq!(nic.objects(), before);
}
