//! Hostile but well-formed files: the verifier refuses them and never panics.

use super::*;

#[test]
fn the_verifier_survives_extreme_values_from_files() {
    let text = edit("{ addr = \"wqe:if@45\", len = 3 }", "{ addr = \"wqe:if@45\", len = 4294967295 }")
        .replace("sgl = [{ addr = \"static:blk\", len = 8 }]", "sgl = [{ addr = \"static:blk+18446744073709551615\", len = 4294967295 }, { addr = \"region:data+18446744073709551615\", len = 4294967295 }]")
        .replace("remote = \"wqe:reply@0\"", "remote = \"wqe:reply@63\"")
        .replace("name = \"key\"\nlen = 6", "name = \"key\"\noffset = 4294967290\nlen = 5");
    let p = parse_definition(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    let g = Grants::new()
        .with_region("data", Access::ALL, u64::MAX)
        .with_region("response", Access::REMOTE_WRITE, u64::MAX);
    let r = verify(&p, &g);
    assert!(!r.accepted());
    assert!(r.log().contains("\nchecked "), "{}", r.log());
}

#[test]
fn mutated_files_never_panic_and_what_loads_round_trips() {
    let server_loop = write_definition(&catalog::server_loop().unwrap());
    // xorshift64*, fixed seed: the same mutations every run.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let alphabet = b"[]{}=\"'#.,:+@-_0123456789xabf \n\ttrue";
    let grants = Grants::new().with_region("data", Access::ALL, 64);
    let mut loaded = 0;
    for round in 0..600 {
        let base = if round % 2 == 0 {
            TINY
        } else {
            server_loop.as_str()
        };
        let mut bytes = base.as_bytes().to_vec();
        for _ in 0..1 + next() % 3 {
            let at = usize::try_from(next() % bytes.len() as u64).unwrap();
            let c = alphabet[usize::try_from(next() % alphabet.len() as u64).unwrap()];
            match next() % 3 {
                0 => bytes[at] = c,
                1 => bytes.insert(at, c),
                _ => {
                    bytes.remove(at);
                }
            }
        }
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        match parse_definition(&text, "m.toml") {
            Err(e) => assert!(e.to_string().starts_with("m.toml"), "{e}"),
            Ok(p) => {
                loaded += 1;
                round_trip(&p);
                let _ = verify(&p, &grants).log();
            }
        }
    }
    assert!(loaded > 15, "only {loaded} mutants loaded");
    for (i, _) in TINY.char_indices().step_by(3) {
        let _ = parse_definition(&TINY[..i], "cut.toml");
    }
}

#[test]
fn raw_opcodes_load_and_the_verifier_refuses_them() {
    let g = Grants::new()
        .with_region("data", Access::ALL, 64)
        .with_region("response", Access::REMOTE_WRITE, 4096);
    // UMR (not on the allow-list) and SEND (on it, but a raw opcode has no operands).
    for opcode in ["0x25", "0x0a"] {
        let text = edit(
            "label = \"answer\"\nop = \"send-en\"\nqueue = \"client\"\ncount = 1",
            &format!("label = \"answer\"\nopcode = {opcode}"),
        );
        let p = parse_definition(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        let r = verify(&p, &g);
        assert!(r.broke(redn_policy::Rule::Opcode), "{}", r.log());
        assert!(
            r.log().contains("wqe 2 (answer): opcode: opcode: "),
            "{}",
            r.log()
        );
    }
}

/// The opcodes a program may contain, written out from the hardware's opcode table (NOP,
/// WRITE, WRITE_IMM, SEND, SEND_IMM, CQE_WAIT, READ, CAS, FAA, masked CAS, RECV_EN, SEND_EN)
/// rather than read from `redn_policy::verifier::ALLOWED_OPCODES`, so that a change to that
/// list shows here.
const ALLOWED_BYTES: [u8; 12] = [
    0x00, 0x08, 0x09, 0x0a, 0x0b, 0x0f, 0x10, 0x11, 0x12, 0x14, 0x16, 0x17,
];

#[test]
fn every_raw_opcode_is_judged_by_the_allow_list() {
    let g = Grants::new()
        .with_region("data", Access::ALL, 64)
        .with_region("response", Access::REMOTE_WRITE, 4096);
    let reply = "op = \"write\"\nform = \"nop\"\nremote = \"region:response+0\"\nsgl = [{ addr = \
                 \"static:blk\", len = 8 }]\nimm = 7";
    let mut loaded = Vec::new();
    for byte in 0..=u8::MAX {
        // The response WQE, the one RedN's `if` CAS turns active, written as a raw opcode:
        // both the WQE itself and the CAS's swap (which installs it) are judged.
        let text = edit(reply, &format!("opcode = {byte:#04x}\nform = \"nop\""));
        let p = match parse_definition(&text, "t.toml") {
            Ok(p) => p,
            Err(e) => {
                // Only opcodes the format writes with their operands are refused raw.
                assert!(
                    e.to_string()
                        .contains("write it as op = \"...\" with its operands"),
                    "{byte:#04x}: {e}"
                );
                continue;
            }
        };
        loaded.push(byte);
        let findings: Vec<String> = verify(&p, &g)
            .findings
            .iter()
            .map(ToString::to_string)
            .collect();
        let expected = if ALLOWED_BYTES.contains(&byte) {
            // Allowed, but a raw opcode has no operands to check.
            vec![format!(
                "queue client: wqe 0 (reply): opcode: opcode: raw opcode {byte:#04x} carries \
                 no operands the verifier can check"
            )]
        } else {
            vec![
                format!(
                    "queue client: wqe 0 (reply): opcode: opcode: opcode {byte:#04x} is not on \
                     the allow-list"
                ),
                format!(
                    "queue worker: wqe 1 (if): swap: unsafe-swap: swap installs opcode \
                     {byte:#04x}, which is not allowed"
                ),
            ]
        };
        assert_eq!(findings, expected, "opcode {byte:#04x}");
    }
    // SEND, SEND_IMM (allowed, with no `op` of their own) and MASKED_FAA (not allowed) load
    // raw, as does every byte that is no opcode; the other known opcodes do not.
    let known_refused = [0x00, 0x08, 0x09, 0x0f, 0x10, 0x11, 0x12, 0x14, 0x16, 0x17];
    assert_eq!(loaded.len(), 256 - known_refused.len());
    for b in [0x0a, 0x0b, 0x15] {
        assert!(loaded.contains(&b), "{b:#04x}");
    }
}
