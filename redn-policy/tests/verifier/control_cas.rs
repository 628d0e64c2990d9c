//! A CAS on a control word: it may patch only inside its compare's operand slots.

use super::*;

#[test]
fn patches_straddling_a_cas_operand_slot_are_refused() {
    // RedN's `if` CAS "0.b0.if" and `else` masked CAS "0.b0.else" both act on the response
    // WQE's control word. The compare operand (bytes 40..48) is the byte-reversed control
    // image: bytes 41..44 and 45..48 hold its operand slots (where the trigger writes the
    // key), byte 40 its ds and byte 44 its opcode. The trigger's patches on "0.b0.if" cover
    // exactly the two slots, and the program is accepted.
    assert!(verify(&base(), &grants()).accepted());
    let key = || PatchSource::Trigger {
        param: "key0".into(),
    };
    // Inside a slot: accepted.
    for (byte, len) in [(41, 3), (42, 2), (43, 1), (45, 3), (46, 1), (47, 1)] {
        let mut p = base();
        patch(&mut p, "0.b0.if", byte, len, key());
        let r = verify(&p, &grants());
        assert!(r.accepted(), "{byte}+{len}: {}", r.log());
    }
    // Starting inside a slot and running out of it (onto the compare's opcode byte, across
    // both slots, past the compare into the padding or the masked CAS's swap mask), and
    // starting just before a slot: refused, however the start lies.
    for (label, byte, len) in [
        ("0.b0.if", 43, 2),
        ("0.b0.if", 42, 3),
        ("0.b0.if", 41, 7),
        ("0.b0.if", 47, 2),
        ("0.b0.if", 40, 2),
        ("0.b0.if", 44, 2),
        ("0.b0.else", 43, 2),
        ("0.b0.else", 47, 2),
        ("0.b0.else", 45, 11),
    ] {
        let mut p = base();
        patch(&mut p, label, byte, len, key());
        let r = verify(&p, &grants());
        let f = only_finding(
            &r,
            Rule::UnsafeSwap,
            label,
            &format!("bytes {byte}..{}", byte + len),
        );
        assert_eq!(
            f.detail,
            "trigger parameter \"key0\" may rewrite this CAS's swap or the opcode/ds bytes of \
             its compare",
            "{label} {byte}+{len}"
        );
    }
}

/// A refused write names the WQE that could make it, the patch point whose key it would go
/// through, and where those bytes lie in the code region.
#[test]
fn a_refused_write_names_its_writer_key_and_code_bytes() {
    let mut p = base();
    if let Op::Read { sgl, .. } = &mut wqe_mut(&mut p, "0.b0.read").op {
        sgl.push(Sge::new(Addr::wqe("0.b0.if", 24), 4));
    }
    patch(&mut p, "0.b0.if", 24, 4, read_source());
    // Where 0.b0.if starts: its queue's ring, plus the blocks of the WQEs before it.
    let layout = p.layout().unwrap();
    let (qi, q) = p
        .queues
        .iter()
        .enumerate()
        .find(|(_, q)| q.wqes.iter().any(|w| w.label == "0.b0.if"))
        .unwrap();
    let before: u64 = q
        .wqes
        .iter()
        .take_while(|w| w.label != "0.b0.if")
        .map(|w| w.op.bbs())
        .sum();
    let at = layout.sq[qi] + usize::try_from(before).unwrap() * 64 + 24;
    let r = verify(&p, &grants());
    let f = r
        .findings
        .iter()
        .find(|f| f.rule == Rule::ProtectedField)
        .unwrap_or_else(|| panic!("{}", r.log()));
    assert_eq!(
        f.detail,
        format!(
            "READ \"0.b0.read\" may rewrite the rkey (bytes 24..28) through the key over its \
             patch point 0.b0.if@24..28 (code bytes {at}..{})",
            at + 4
        )
    );
}
