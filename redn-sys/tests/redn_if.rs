//! The README's demo, the catalog's hash-get served by the softnic, checked: hits return the
//! bucket's value, misses a zero-length answer, under every prefetch model, with no server
//! host posts.

#[path = "../examples/redn_demo.rs"]
#[allow(dead_code)]
mod demo;

use redn_program::wqe::Opcode;
use redn_sys::softnic::Prefetch;

#[test]
fn hash_get_hits_and_misses_in_every_prefetch_mode() {
    for mode in [
        Prefetch::AtExecute,
        Prefetch::Depth(8),
        Prefetch::Adversarial,
    ] {
        let reqs: Vec<(u64, u64)> = vec![
            (demo::key_of_bucket(3), 3),
            (demo::key_of_bucket(3) ^ 1, 3), // wrong key for the bucket
            (demo::key_of_bucket(9), 9),
            (demo::key_of_bucket(9), 10), // right key, wrong bucket
            (demo::key_of_bucket(15), 15),
        ];
        let (answers, stats) = demo::run(&reqs, mode);
        let got: Vec<Option<Vec<u8>>> = answers.iter().map(|a| a.value.clone()).collect();
        assert_eq!(
            got,
            vec![
                Some(demo::value_of(demo::key_of_bucket(3))),
                None,
                Some(demo::value_of(demo::key_of_bucket(9))),
                None,
                Some(demo::value_of(demo::key_of_bucket(15))),
            ],
            "{mode:?}"
        );
        assert_eq!(stats.host_posts_after_setup, 0);
        let count = |op| {
            stats
                .by_opcode
                .iter()
                .find(|(o, _)| *o == op)
                .map_or(0, |(_, n)| *n)
        };
        assert_eq!(count(Opcode::AtomicCs), 5, "one `if` per GET");
        assert_eq!(count(Opcode::AtomicMaskedCs), 5, "one `else` per GET");
        assert_eq!(
            count(Opcode::RdmaWriteImm),
            5,
            "{mode:?}: one answer per GET, a value or zero bytes"
        );
    }
}
