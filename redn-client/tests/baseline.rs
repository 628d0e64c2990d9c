//! The Fig. 10 baselines (one-sided READs, two-sided RPC) serving a two-choice table over
//! the softnic's RoCEv2 on loopback: present, absent and second-bucket keys, a 64 KiB value,
//! a concurrent writer, malformed requests.

use redn_client::baseline::{
    map_region, BaselineOptions, OneSidedClient, OneSidedServer, Probe, RpcClient, RpcServer,
    TableLayout, REQUEST_LEN,
};
use redn_client::kv::{bucket_bytes, bucket_indices, TwoChoiceTable, BUCKET_STRIDE};
use redn_client::{Error, SealedRegion};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A base unlike the mapping's address, as the manager's would be.
const BASE: u64 = 0x5500_0000_0000;

fn listen() -> SocketAddr {
    "127.0.0.1:0".parse().expect("address")
}

fn opts() -> BaselineOptions {
    BaselineOptions {
        timeout: Duration::from_secs(10),
        ..BaselineOptions::default()
    }
}

fn table(buckets: u64) -> TwoChoiceTable {
    let mut t = TwoChoiceTable::create(buckets).expect("table");
    t.set_base(BASE);
    t
}

/// Both servers on `table`'s live memory.
fn servers(t: &TwoChoiceTable) -> (OneSidedServer, RpcServer) {
    start_both(t.region(), TableLayout::of(t))
}

/// Both servers on `region`'s memory laid out as `layout`.
fn start_both(region: &SealedRegion, layout: TableLayout) -> (OneSidedServer, RpcServer) {
    let memory = map_region(region).expect("map");
    (
        OneSidedServer::start(Arc::clone(&memory), layout, listen(), opts()).expect("one-sided"),
        RpcServer::start(memory, layout, listen(), opts()).expect("rpc"),
    )
}

/// Both servers on `region` (`buckets` buckets) after writing `key`'s first bucket by hand:
/// a value of `len` bytes at `addr`, wherever that is.
fn servers_on(
    region: &SealedRegion,
    buckets: u64,
    key: u64,
    len: u32,
    addr: u64,
) -> (OneSidedServer, RpcServer) {
    let bucket = bucket_indices(key, buckets)[0];
    region
        .write_at(bucket * BUCKET_STRIDE, &bucket_bytes(key, len, addr))
        .unwrap();
    start_both(
        region,
        TableLayout {
            buckets,
            base: BASE,
        },
    )
}

/// A key whose first bucket is `taken`'s bucket, so it lands in its second.
/// Wait until the RPC server has counted `n` answers, and no more: it counts one once it has
/// posted it, which the answer itself may beat to the client.
fn answered(rpc: &RpcServer, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while rpc.stats().answered < n {
        assert!(
            Instant::now() < deadline,
            "{} answers counted, not {n}",
            rpc.stats().answered
        );
        std::thread::yield_now();
    }
    assert_eq!(rpc.stats().answered, n);
}

fn colliding_key(t: &TwoChoiceTable, taken: u64) -> u64 {
    let want = bucket_indices(taken, t.buckets())[0];
    (taken + 1..)
        .find(|&k| {
            let [a, b] = bucket_indices(k, t.buckets());
            a == want && b != bucket_indices(taken, t.buckets())[1]
        })
        .expect("some key collides")
}

#[test]
fn present_absent_and_second_bucket_keys_read_back_through_both_baselines() {
    let mut t = table(64);
    t.set(7, b"seven").unwrap();
    t.set(1000, b"").unwrap();
    let second = colliding_key(&t, 7);
    t.set(second, b"in the second bucket").unwrap();
    let (one, rpc) = servers(&t);
    let mut seq = OneSidedClient::connect(one.addr(), Probe::Sequential, opts()).unwrap();
    let mut par = OneSidedClient::connect(one.addr(), Probe::Parallel, opts()).unwrap();
    let mut r = RpcClient::connect(rpc.addr(), opts()).unwrap();

    for (key, want) in [
        (7, Some(&b"seven"[..])),
        (1000, Some(&b""[..])),
        (second, Some(&b"in the second bucket"[..])),
        (99, None),
    ] {
        let want = want.map(<[u8]>::to_vec);
        assert_eq!(
            seq.get(key).unwrap(),
            want,
            "sequential one-sided, key {key}"
        );
        assert_eq!(par.get(key).unwrap(), want, "parallel one-sided, key {key}");
        assert_eq!(r.get(key).unwrap(), want, "RPC, key {key}");
        assert_eq!(t.get(key).unwrap(), want, "the table itself, key {key}");
    }
    // Round trips per GET: the first bucket and the value; the second bucket costs the
    // sequential probe one more.
    let before = seq.round_trips();
    seq.get(7).unwrap();
    assert_eq!(seq.round_trips() - before, 2);
    let before = seq.round_trips();
    seq.get(second).unwrap();
    assert_eq!(seq.round_trips() - before, 3);
    let before = par.round_trips();
    par.get(second).unwrap();
    assert_eq!(par.round_trips() - before, 2);
    assert!(matches!(r.get(0), Err(Error::BadKey(0))));
    answered(&rpc, 4);
    assert_eq!(rpc.stats().malformed, 0);
    assert_eq!(one.stats().connections, 2);
}

#[test]
fn a_64_kib_value_is_read_and_sent_whole() {
    // The kv table's slots hold 64 bytes; the bucket format holds any length and address,
    // so a larger value is placed by hand past the buckets.
    let buckets = 16;
    let region = SealedRegion::create("big", 4096 + (64 << 10)).unwrap();
    let key = 0xabc;
    let value: Vec<u8> = (0..64u32 << 10).map(|i| (i % 251) as u8).collect();
    region.write_at(4096, &value).unwrap();
    let (one, rpc) = servers_on(&region, buckets, key, 64 << 10, BASE + 4096);
    let mut c = OneSidedClient::connect(one.addr(), Probe::Sequential, opts()).unwrap();
    assert_eq!(c.get(key).unwrap().as_deref(), Some(&value[..]));
    let mut r = RpcClient::connect(rpc.addr(), opts()).unwrap();
    assert_eq!(r.get(key).unwrap().as_deref(), Some(&value[..]));

    // A client configured for smaller values refuses it rather than reading past its buffer.
    let small = BaselineOptions {
        max_value: 4096,
        ..opts()
    };
    let mut c = OneSidedClient::connect(one.addr(), Probe::Parallel, small).unwrap();
    assert!(matches!(c.get(key), Err(Error::BadAnswer { .. })));
    let mut r = RpcClient::connect(rpc.addr(), small).unwrap();
    assert!(matches!(r.get(key), Err(Error::BadAnswer { .. })));
    // And the server still answers the next request.
    let mut r = RpcClient::connect(rpc.addr(), opts()).unwrap();
    assert_eq!(r.get(key).unwrap().map(|v| v.len()), Some(64 << 10));
}

#[test]
fn a_bucket_pointing_outside_the_region_is_refused_by_both() {
    let buckets = 16;
    let region = SealedRegion::create("bad", 8192).unwrap();
    let key = 0x77;
    // 64 bytes starting 32 bytes before the end: past the region.
    let (one, rpc) = servers_on(&region, buckets, key, 64, BASE + 8192 - 32);
    let mut c = OneSidedClient::connect(one.addr(), Probe::Sequential, opts()).unwrap();
    assert!(matches!(c.get(key), Err(Error::BadAnswer { .. })));
    let mut r = RpcClient::connect(rpc.addr(), opts()).unwrap();
    assert!(matches!(r.get(key), Err(Error::BadAnswer { .. })));
}

#[test]
fn gets_during_a_concurrent_writer_see_old_or_new_bytes_only() {
    let mut t = table(64);
    let key = 42;
    t.set(key, &[1u8; 8]).unwrap();
    let (one, rpc) = servers(&t);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    // Generation g writes g+1 repeated over a length from 8 to 64: a reader may see any
    // length and a mix of two generations' bytes, never a byte nobody wrote.
    let writer = std::thread::spawn(move || {
        let mut g = 1u8;
        let mut sets = 0u64;
        while !stop2.load(Ordering::Acquire) {
            g = g % 200 + 1;
            let len = 8 + usize::from(g) % 57;
            t.set(key, &vec![g; len]).expect("set");
            sets += 1;
        }
        sets
    });
    let mut seq = OneSidedClient::connect(one.addr(), Probe::Sequential, opts()).unwrap();
    let mut r = RpcClient::connect(rpc.addr(), opts()).unwrap();
    for _ in 0..200 {
        for v in [seq.get(key).unwrap(), r.get(key).unwrap()] {
            let v = v.expect("the key stays present");
            assert!((8..=64).contains(&v.len()), "length {}", v.len());
            assert!(v.iter().all(|&b| (1..=200).contains(&b)), "{v:?}");
        }
    }
    stop.store(true, Ordering::Release);
    assert!(writer.join().unwrap() > 0);
}

#[test]
fn malformed_requests_are_dropped_and_the_server_keeps_serving() {
    let mut t = table(16);
    t.set(5, b"five").unwrap();
    let (_one, rpc) = servers(&t);
    let mut r = RpcClient::connect(rpc.addr(), opts()).unwrap();
    let mut good = [0u8; REQUEST_LEN];
    good[..8].copy_from_slice(&5u64.to_be_bytes());
    good[8..12].copy_from_slice(&9u32.to_be_bytes());
    let mut reserved = good;
    reserved[15] = 1;
    let mut key0 = good;
    key0[..8].fill(0);
    let mut wide_key = good;
    wide_key[..8].copy_from_slice(&(1u64 << 48).to_be_bytes());
    let mut wide_id = good;
    wide_id[8..12].copy_from_slice(&0x0100_0000u32.to_be_bytes());
    let malformed: [&[u8]; 7] = [
        &[1, 2, 3],
        &[],
        &[0u8; 17],
        &reserved,
        &key0,
        &wide_key,
        &wide_id,
    ];
    for m in malformed {
        r.send_raw(m).unwrap();
    }
    // Requests on one queue pair are served in order: once this is answered, all were seen.
    assert_eq!(r.get(5).unwrap().as_deref(), Some(&b"five"[..]));
    answered(&rpc, 1);
    let s = rpc.stats();
    assert_eq!(s.malformed, 7);
    assert_eq!(s.answered, 1);

    // A request longer than the server's receive fails that client's queue pair only.
    let mut rude = RpcClient::connect(rpc.addr(), opts()).unwrap();
    rude.send_raw(&[0xee; 100]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rpc.stats().failed == 0 {
        assert!(
            Instant::now() < deadline,
            "the over-long request was not seen"
        );
        std::thread::yield_now();
    }
    assert_eq!(r.get(5).unwrap().as_deref(), Some(&b"five"[..]));
    let mut again = RpcClient::connect(rpc.addr(), opts()).unwrap();
    assert_eq!(again.get(6).unwrap(), None);
}

#[test]
fn clients_and_servers_refuse_what_does_not_fit() {
    let t = table(16);
    let (one, rpc) = servers(&t);
    match OneSidedClient::connect(rpc.addr(), Probe::Sequential, opts()) {
        Err(Error::BadAnswer { detail, .. }) => {
            assert!(detail.contains("not a one-sided"), "{detail}")
        }
        other => panic!("a one-sided client at an RPC server: {other:?}"),
    }
    match RpcClient::connect(one.addr(), opts()) {
        Err(Error::BadAnswer { detail, .. }) => {
            assert!(detail.contains("not a RPC server"), "{detail}")
        }
        other => panic!("an RPC client at a one-sided server: {other:?}"),
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while rpc.stats().refused + one.stats().refused < 2 {
        assert!(Instant::now() < deadline, "refusals not counted");
        std::thread::yield_now();
    }
    let memory = map_region(t.region()).unwrap();
    let too_many = TableLayout {
        buckets: (memory.len() as u64 / BUCKET_STRIDE) + 1,
        base: BASE,
    };
    assert!(matches!(
        OneSidedServer::start(Arc::clone(&memory), too_many, listen(), opts()),
        Err(Error::BadAnswer { .. })
    ));
    let huge = BaselineOptions {
        max_value: u32::MAX,
        ..opts()
    };
    assert!(matches!(
        RpcServer::start(memory, TableLayout::of(&t), listen(), huge),
        Err(Error::BadAnswer { .. })
    ));
    // A garbage hello is refused without harming the server.
    let mut s = std::net::TcpStream::connect(one.addr()).unwrap();
    std::io::Write::write_all(&mut s, b"GARBAGE!").unwrap();
    drop(s);
    let mut c = OneSidedClient::connect(one.addr(), Probe::Parallel, opts()).unwrap();
    assert_eq!(c.get(3).unwrap(), None);
}

/// Not a test: the body of the app process `a_sigkilled_app_takes_both_servers_with_it`
/// starts (this binary again): a table, both servers on it, their addresses on stdout,
/// then serving until stdin closes or a signal ends it.
#[test]
#[ignore = "run by another test as an app process"]
fn server_process_entry() {
    if std::env::var_os("REDN_BASELINE_SERVER").is_none() {
        return;
    }
    let mut t = table(16);
    t.set(11, b"eleven").unwrap();
    let (one, rpc) = servers(&t);
    println!("BASELINE {} {}", one.addr(), rpc.addr());
    std::io::Write::flush(&mut std::io::stdout()).unwrap();
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
}

#[test]
fn a_sigkilled_app_takes_both_servers_with_it() {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "server_process_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("REDN_BASELINE_SERVER", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    // libtest prints "test NAME ... " before the body runs, on the same line.
    let line = std::io::BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.split_once("BASELINE ").map(|(_, rest)| rest.to_owned()))
        .expect("the app process's addresses");
    let (one, rpc) = line.split_once(' ').unwrap();
    let quick = BaselineOptions {
        timeout: Duration::from_secs(5),
        ..opts()
    };
    let mut c = OneSidedClient::connect(one.parse().unwrap(), Probe::Sequential, quick).unwrap();
    let mut r = RpcClient::connect(rpc.parse().unwrap(), quick).unwrap();
    assert_eq!(c.get(11).unwrap().as_deref(), Some(&b"eleven"[..]));
    assert_eq!(r.get(11).unwrap().as_deref(), Some(&b"eleven"[..]));
    child.kill().unwrap();
    child.wait().unwrap();
    // Nobody answers any more: the READ's retries run out or the wait ends, an error
    // either way, never a hang or a wrong value.
    for result in [c.get(11), r.get(11)] {
        assert!(
            matches!(
                result,
                Err(Error::Timeout { .. } | Error::ResponseFailed { .. })
            ),
            "{result:?}"
        );
    }
}
