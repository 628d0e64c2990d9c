//! Offload definitions edited as an attacker would, judged as `redn offload verify` and
//! `--check` judge them.

use super::*;

#[test]
fn hostile_edits_of_a_shipped_definition_are_refused_naming_the_rule() {
    // An offload definition edited to escape its grants, judged as `redn offload verify`
    // and `--check` judge it: each edit refused, naming the file position or the rule.
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let shipped = |name: &str| {
        std::fs::read_to_string(repo.join(format!("etc/redn/offloads.d/{name}.toml"))).unwrap()
    };
    let dir = std::env::temp_dir().join(format!("redn-attacks-defs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("policy.toml"), policy("", "")).unwrap();
    let cas = "op = \"cas\"\nfence = true\nremote = \"wqe:0.r0@0\"\n";
    let edits: &[(&str, &str, &str, &str)] = &[
        // (offload, text, replacement, what the refusal says)
        ("echo", "sq_bbs = 4", "sq_bbs = 4294967295", "is not a power of two"),
        ("echo", "len = 256", "len = 18446744073709551615", "the most a program may keep"),
        ("echo", "count = 8", "count = 4294967295", "index-window"),
        ("echo", "wqes_per_invocation = 3", "wqes_per_invocation = 4294967295", "wqe-budget"),
        ("echo", "static:echo+0\"", "static:echo+18446744073709551615\"", "out-of-region"),
        ("echo", "len = 64 }]", "len = 4294967295 }]", "out-of-region"),
        (
            "hash-get",
            "bytes = [0, 3]\nsource = \"read:0.b0.read\"",
            "bytes = [0, 64]\nsource = \"read:0.b0.read\"",
            "protected-field",
        ),
        (
            "hash-get",
            "bytes = [16, 24]\nsource = \"trigger:bucket0\"",
            "bytes = [16, 72]\nsource = \"trigger:bucket0\"",
            "may rewrite the rkey",
        ),
        (
            "hash-get",
            "bytes = [41, 44]\nsource = \"trigger:key0\"",
            "bytes = [0, 8]\nsource = \"trigger:key0\"",
            "may rewrite the opcode",
        ),
        (
            "hash-get",
            "swap = \"ctrl:0.r0:active:real\"",
            "swap = \"0x0a00000000000008\"",
            "unsafe-swap",
        ),
        (
            "hash-get",
            cas,
            "op = \"cas\"\nfence = true\nremote = \"wqe:0.r0@4\"\n",
            "misaligned",
        ),
        (
            "hash-get",
            cas,
            "op = \"cas\"\nfence = true\nremote = \"wqe:1.r0@0\"\n",
            "undeclared-patch",
        ),
        (
            "hash-get",
            "op = \"cas\"\nfence = true\nremote = \"wqe:0.r0@0\"\ncompare = \"ctrl:0.r0:nop:operand=0x0\"\nswap = \"ctrl:0.r0:active:real\"",
            "op = \"faa\"\nfence = true\nremote = \"wqe:0.r0@0\"\nadd = 1",
            "FETCH_ADD aimed at a WQE",
        ),
    ];
    for (offload, text, edit, says) in edits {
        let original = shipped(offload);
        assert!(original.contains(text), "{offload}: no {text:?} to edit");
        let file = dir.join(format!("{offload}.toml"));
        std::fs::write(&file, original.replacen(text, edit, 1)).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_redn"))
            .args(["offload", "verify"])
            .arg(&file)
            .arg("--policy")
            .arg(dir.join("policy.toml"))
            .output()
            .unwrap();
        let text_out = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            out.status.code(),
            Some(1),
            "{offload} with {edit:?}: {text_out}"
        );
        assert!(
            text_out.contains(says),
            "{offload} with {edit:?}: {text_out}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
