//! The shipped catalog files: they load to exactly the builders' programs, verify and round-trip.

use super::*;

#[test]
fn shipped_files_load_to_exactly_the_builders_programs() {
    let shipped = shipped_offloads().unwrap();
    let names: Vec<String> = shipped.iter().map(|s| s.file_name()).collect();
    assert_eq!(
        names,
        [
            "echo.toml",
            "hash-get.toml",
            "hash-get-seq.toml",
            "hash-get-par.toml",
            "list-find.toml",
            "list-find-break.toml",
            "server-loop.toml"
        ]
    );
    for s in &shipped {
        let path = offloads_d().join(s.file_name());
        let loaded = load_definition(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loaded, s.program, "{}", path.display());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text == s.file_text(),
            "{} is not what the builder generates: run `cargo run -p redn-policy --example gen_offloads`",
            path.display()
        );
        assert!(
            text.starts_with(&format!("# {}: ", s.program.name)),
            "{}",
            s.file_name()
        );
        assert!(text.contains(&format!("redn_program::program::{} ", s.builder)));
        assert!(
            (text.len() as u64) < MAX_FILE_BYTES / 2,
            "{} is too close to the cap",
            s.file_name()
        );
    }
    // The builder defaults the issue documents.
    assert_eq!(shipped[0].program, catalog::echo(64, 4).unwrap());
    assert_eq!(
        shipped[1].program,
        catalog::hash_get(HashVariant::Single, 4).unwrap()
    );
    assert_eq!(
        shipped[2].program,
        catalog::hash_get(HashVariant::Sequential, 4).unwrap()
    );
    assert_eq!(
        shipped[3].program,
        catalog::hash_get(HashVariant::Parallel, 4).unwrap()
    );
    assert_eq!(shipped[4].program, catalog::list_find(8, false, 4).unwrap());
    assert_eq!(shipped[5].program, catalog::list_find(8, true, 1).unwrap());
    assert_eq!(shipped[6].program, catalog::server_loop().unwrap());
}

#[test]
fn the_shipped_directory_loads_sorted() {
    let programs = load_offloads_dir(offloads_d()).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = programs.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "echo",
            "hash-get",
            "hash-get-par",
            "hash-get-seq",
            "list-find",
            "list-find-break",
            "server-loop"
        ]
    );
}

#[test]
fn shipped_programs_pass_the_verifier() {
    let mut g = Grants::new()
        .with_region("table", Access::REMOTE_READ, 1 << 20)
        .with_region("list", Access::REMOTE_READ, 1 << 20)
        .with_region("values", Access::NONE, 1 << 20)
        .with_region("response", Access::REMOTE_WRITE, 1 << 17);
    g.loop_budget = Some(1_000_000);
    g.max_wqes_per_invocation = 256;
    for p in load_offloads_dir(offloads_d()).unwrap() {
        let r = verify(&p, &g);
        assert!(r.accepted(), "{}", r.log());
    }
}

#[test]
fn every_catalog_program_round_trips() {
    let mut programs = vec![
        catalog::echo(1, 1).unwrap(),
        catalog::echo(16, 3).unwrap(),
        catalog::server_loop().unwrap(),
        catalog::list_find(1, false, 1).unwrap(),
        catalog::list_find(4, false, 2).unwrap(),
        catalog::list_find(14, true, 1).unwrap(),
    ];
    for v in [
        HashVariant::Single,
        HashVariant::Sequential,
        HashVariant::Parallel,
    ] {
        for n in [1, 2, 5] {
            programs.push(catalog::hash_get(v, n).unwrap());
        }
    }
    programs.extend(shipped_offloads().unwrap().into_iter().map(|s| s.program));
    for p in &programs {
        round_trip(p);
    }
}
