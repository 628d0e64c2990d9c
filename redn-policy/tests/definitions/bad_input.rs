//! Bad input refused with the file, the line and the key.

use super::*;

#[test]
fn syntax_and_schema_errors_name_line_and_key() {
    refused(
        &edit("count = 0", "count = = 0"),
        "count = = 0",
        "queue.wqe.count",
        "",
    );
    refused(
        &edit("count = 0", "count = -1"),
        "count = -1",
        "queue \"worker\" wqe \"wait\" count",
        "invalid value",
    );
    refused(
        &edit("count = 0", "count = \"zero\""),
        "count = \"zero\"",
        "queue \"worker\" wqe \"wait\" count",
        "invalid type",
    );
    let e = refused(
        &edit("count = 0", "count = 0\ncolour = 1"),
        "colour",
        "queue \"worker\" wqe \"wait\" colour",
        "unknown key",
    );
    assert!(e.contains("`compare_mask`"), "{e}");
    refused(
        &edit("summary = ", "colour = 1\nsummary = "),
        "colour",
        "colour",
        "unknown key",
    );
    refused(
        &edit("op = \"wait\"", "op = \"sleep\""),
        "op = \"sleep\"",
        "queue \"worker\" wqe \"wait\" op",
        "unknown variant `sleep`",
    );
    refused(
        &edit("role = \"worker\"", "role = \"boss\""),
        "role = \"boss\"",
        "queue \"worker\" role",
        "unknown variant `boss`",
    );
    refused(
        &edit("sq_bbs = 4\n", ""),
        "[[queue]]\nname = \"worker\"",
        "queue \"worker\" sq_bbs",
        "required but missing",
    );
    refused(
        &edit("name = \"tiny\"\n", ""),
        "# A hand-written",
        "name",
        "required but missing",
    );
    refused(
        &edit("kind = \"bounded\"", "kind = \"forever\""),
        "iterations",
        "iterations.kind",
        "unknown variant `forever`",
    );
    refused(
        &edit("[[param]]", "[param]"),
        "[param]",
        "param",
        "expected a sequence",
    );
    refused(
        &edit("fence = true", "fence = 1"),
        "fence = 1",
        "queue \"worker\" wqe \"if\" fence",
        "invalid type",
    );
    refused(
        &edit("min_len = 64", "min_len = -64"),
        "min_len = -64",
        "region \"data\" min_len",
        "negative",
    );
    refused(
        &edit("min_len = 64", "min_len = \"lots\""),
        "min_len = \"lots\"",
        "region \"data\" min_len",
        "invalid number \"lots\"",
    );
    refused(
        &edit("len = 16", "len = 16\nlen = 17"),
        "len = 17",
        "static.len",
        "duplicate key",
    );
}

#[test]
fn operation_keys_are_checked() {
    refused(
        &edit("imm = 7", "imm = 7\ncompare = 1"),
        "compare = 1",
        "queue \"client\" wqe \"reply\" compare",
        "does not apply to op \"write\"; it takes remote, sgl, imm",
    );
    refused(
        &edit("remote = \"region:response+0\"\n", ""),
        "[[queue.wqe]]\nlabel = \"reply\"",
        "queue \"client\" wqe \"reply\" remote",
        "op \"write\" needs this key",
    );
    refused(
        &edit("swap = \"ctrl:reply:active:real\"\n", ""),
        "[[queue.wqe]]\nlabel = \"if\"",
        "queue \"worker\" wqe \"if\" swap",
        "op \"cas\" needs this key",
    );
    refused(
        &edit("op = \"wait\"", "opcode = 0x25"),
        "queue = \"client\"\ncount = 0",
        "queue \"worker\" wqe \"wait\" queue",
        "does not apply to opcode 0x25; it takes no operands",
    );
    refused(
        &edit("op = \"wait\"", "op = \"wait\"\nopcode = 0x0f"),
        "opcode = 0x0f",
        "queue \"worker\" wqe \"wait\" opcode",
        "not both",
    );
    refused(
        &edit(
            "op = \"send-en\"\nqueue = \"client\"\ncount = 1",
            "opcode = 0x17",
        ),
        "opcode = 0x17",
        "queue \"worker\" wqe \"answer\" opcode",
        "is SEND_EN: write it as op",
    );
    refused(
        &edit("op = \"send-en\"\n", ""),
        "[[queue.wqe]]\nlabel = \"answer\"",
        "queue \"worker\" wqe \"answer\" op",
        "required but missing",
    );
    refused(
        &edit("fence = true", "flags = 0x80"),
        "flags = 0x80",
        "queue \"worker\" wqe \"if\" flags",
        "not both",
    );
    refused(
        &edit("op = \"wait\"", "opcode = 0x100"),
        "opcode = 0x100",
        "queue \"worker\" wqe \"wait\" opcode",
        "invalid value",
    );
    let many: Vec<String> = (0..62)
        .map(|i| format!("{{ addr = \"static:blk+{i}\", len = 1 }}"))
        .collect();
    refused(
        &edit(
            "sgl = [{ addr = \"static:blk\", len = 8 }]",
            &format!("sgl = [{}]", many.join(", ")),
        ),
        "sgl = [",
        "queue \"client\" wqe \"reply\" sgl",
        "62 non-empty entries make 64 segments; a WQE holds at most 63",
    );
}

#[test]
fn symbolic_fields_are_checked() {
    // The example of the issue, and its neighbours.
    refused(
        &edit("swap = \"ctrl:reply:active:real\"", "swap = \"ctrl:x\""),
        "swap = ",
        "queue \"worker\" wqe \"if\" swap",
        "unknown operand form \"ctrl:x\"",
    );
    refused(
        &edit(
            "swap = \"ctrl:reply:active:real\"",
            "swap = \"ctrl:reply:on:real\"",
        ),
        "swap = ",
        "queue \"worker\" wqe \"if\" swap",
        "unknown operand form",
    );
    refused(
        &edit(
            "swap = \"ctrl:reply:active:real\"",
            "swap = \"ctrl:reply:active:real:ds=64\"",
        ),
        "swap = ",
        "queue \"worker\" wqe \"if\" swap",
        "ds 64 in \"ctrl:reply:active:real:ds=64\" is above 63",
    );
    refused(
        &edit("operand=0x0", "operand=0x1000000000000"),
        "compare = ",
        "queue \"worker\" wqe \"if\" compare",
        "wider than 48 bits",
    );
    refused(
        &edit("swap = \"ctrl:reply:active:real\"", "swap = \"maybe\""),
        "swap = ",
        "queue \"worker\" wqe \"if\" swap",
        "unknown operand form \"maybe\"",
    );
    refused(
        &edit(
            "swap = \"ctrl:reply:active:real\"",
            "swap = \"ctrl:nobody:active:real\"",
        ),
        "swap = ",
        "queue \"worker\" wqe \"if\" swap",
        "the control image of \"nobody\", but no WQE has that label",
    );
    refused(
        &edit("swap = \"ctrl:reply:active:real\"", "swap = -1"),
        "swap = ",
        "queue \"worker\" wqe \"if\" swap",
        "negative",
    );
    refused(
        &edit("remote = \"region:response+0\"", "remote = \"response+0\""),
        "remote = ",
        "queue \"client\" wqe \"reply\" remote",
        "unknown address form \"response+0\"",
    );
    refused(
        &edit(
            "remote = \"region:response+0\"",
            "remote = \"heap:response+0\"",
        ),
        "remote = ",
        "queue \"client\" wqe \"reply\" remote",
        "unknown address form",
    );
    refused(
        &edit(
            "remote = \"region:response+0\"",
            "remote = \"region:response+x\"",
        ),
        "remote = ",
        "queue \"client\" wqe \"reply\" remote",
        "invalid offset \"x\"",
    );
    refused(
        &edit(
            "remote = \"region:response+0\"",
            "remote = \"region:heap+0\"",
        ),
        "remote = ",
        "queue \"client\" wqe \"reply\" remote",
        "region \"heap\" is not declared",
    );
    refused(
        &edit("addr = \"static:blk\"", "addr = \"static:blob\""),
        "static:blob",
        "queue \"client\" wqe \"reply\" sgl[0].addr",
        "static block \"blob\" is not declared",
    );
    refused(
        &edit(
            "{ addr = \"wqe:if@45\", len = 3 }",
            "{ addr = \"wqe:fi@45\", len = 3 }",
        ),
        "wqe:fi",
        "queue \"client\" recv[0].sgl[1].addr",
        "no WQE is labelled \"fi\"",
    );
    refused(
        &edit(
            "{ addr = \"wqe:if@45\", len = 3 }",
            "{ addr = \"wqe:if@64\", len = 3 }",
        ),
        "wqe:if@64",
        "queue \"client\" recv[0].sgl[1].addr",
        "byte 64 is outside WQE \"if\", which has 64 bytes",
    );
    refused(
        &edit(
            "{ addr = \"wqe:if@45\", len = 3 }",
            "{ addr = \"wqe:if@45\", len = 3, key = 1 }",
        ),
        "wqe:if@45",
        "queue \"client\" recv[0].sgl[1].key",
        "unknown key",
    );
    refused(
        &edit(
            "queue = \"client\"\ncount = 0",
            "queue = \"server\"\ncount = 0",
        ),
        "queue = \"server\"",
        "queue \"worker\" wqe \"wait\" queue",
        "no queue is called \"server\"",
    );
    refused(
        &edit(
            "entry = [{ queue = \"worker\", count = 3 }]",
            "entry = [{ queue = \"workers\", count = 3 }]",
        ),
        "entry = ",
        "entry[0].queue",
        "no queue is called \"workers\"",
    );
}

#[test]
fn names_are_unique_and_well_formed() {
    let e = refused(
        &edit("label = \"answer\"", "label = \"wait\""),
        "label = \"wait\"\nop = \"send-en\"",
        "queue \"worker\" wqe \"wait\" label",
        "WQE label \"wait\" is already defined",
    );
    assert!(
        e.contains(&format!("(line {})", line_of(TINY, "label = \"wait\""))),
        "{e}"
    );
    refused(
        &edit("name = \"client\"", "name = \"worker\""),
        "name = \"worker\"\nrole = \"worker\"",
        "queue \"worker\" name",
        "queue \"worker\" is already defined",
    );
    refused(
        &edit("name = \"data\"", "name = \"response\""),
        "name = \"response\"\nrole = \"response\"",
        "region \"response\" name",
        "region \"response\" is already defined",
    );
    refused(
        &edit("label = \"if\"\nop", "label = \"if then\"\nop"),
        "label = \"if then\"",
        "queue \"worker\" wqe \"if then\" label",
        "invalid name \"if then\"",
    );
    refused(
        &edit("name = \"tiny\"", "name = \"\""),
        "name = \"\"",
        "name",
        "invalid name \"\"",
    );
    refused(
        &edit("name = \"blk\"", "name = \"-blk\""),
        "name = \"-blk\"",
        "static \"-blk\" name",
        "starting with a letter or digit",
    );
}

#[test]
fn patch_points_are_checked() {
    refused(
        &edit("bytes = [45, 48]", "bytes = [48, 45]"),
        "bytes = [48, 45]",
        "patch \"if\" bytes",
        "from < to",
    );
    refused(
        &edit("bytes = [45, 48]", "bytes = [45, 48, 50]"),
        "bytes = [45, 48, 50]",
        "patch \"if\" bytes",
        "from < to",
    );
    refused(
        &edit("bytes = [45, 48]", "bytes = [45, 65]"),
        "bytes = [45, 65]",
        "patch \"if\" bytes",
        "bytes 45..65 are outside WQE \"if\", which has 64 bytes",
    );
    refused(
        &edit("len = 3\nsource", "len = 0\nsource"),
        "len = 0",
        "patch \"if\" len",
        "at least one byte",
    );
    refused(
        &edit("bytes = [45, 48]", "bytes = [45, 48]\nbyte = 45"),
        "byte = 45",
        "patch \"if\" byte",
        "not both",
    );
    refused(
        &edit("len = 3\nsource", "source"),
        "[[patch]]\nlabel = \"if\"\nbyte = 41",
        "patch \"if\" len",
        "required but missing",
    );
    refused(
        &edit("source = \"cas:if\"", "source = \"cas:fi\""),
        "source = \"cas:fi\"",
        "patch \"reply\" source",
        "the source is \"fi\", but no WQE has that label",
    );
    refused(
        &edit(
            "byte = 41\nlen = 3\nsource = \"trigger:key\"",
            "byte = 41\nlen = 3\nsource = \"trigger:key2\"",
        ),
        "trigger:key2",
        "patch \"if\" source",
        "no trigger parameter is called \"key2\"",
    );
    refused(
        &edit("source = \"cas:if\"", "source = \"dma:if\""),
        "source = \"dma:if\"",
        "patch \"reply\" source",
        "unknown patch source \"dma:if\"",
    );
    refused(
        &edit("label = \"reply\"\nbytes", "label = \"replay\"\nbytes"),
        "label = \"replay\"",
        "patch \"replay\" label",
        "no WQE is labelled \"replay\"",
    );
}

#[test]
fn sizes_and_other_values_are_checked() {
    refused(
        &edit("sq_bbs = 4", "sq_bbs = 2"),
        "sq_bbs = 2",
        "queue \"worker\" sq_bbs",
        "the queue's WQEs take 3 BBs, more than its ring of 2",
    );
    refused(
        &edit("sq_bbs = 4", "sq_bbs = 3"),
        "sq_bbs = 3",
        "queue \"worker\" sq_bbs",
        "not a power of two",
    );
    refused(
        &edit("sq_bbs = 4", "sq_bbs = 33554432"),
        "sq_bbs = 33554432",
        "queue \"worker\" sq_bbs",
        "from 1 to 16777216",
    );
    refused(
        &edit("rq_sges = 2", "rq_sges = 1"),
        "sgl = [{ addr = \"wqe:if@41\"",
        "queue \"client\" recv[0].sgl",
        "2 entries, but a slot holds rq_sges = 1",
    );
    refused(
        &edit("[[queue.recv]]", "[[queue.recv]]\nsgl = []\n[[queue.recv]]"),
        "rq_slots = 1",
        "queue \"client\" rq_slots",
        "2 receives do not fit 1 slots",
    );
    refused(
        &edit(
            "access = \"remote-read|local-write\"",
            "access = \"remote-read|write\"",
        ),
        "access = ",
        "region \"data\" access",
        "unknown right \"write\"",
    );
    refused(
        &edit("access = \"remote-read|local-write\"\n", ""),
        "[[region]]\nname = \"data\"",
        "region \"data\" access",
        "needs the rights",
    );
    refused(
        &edit(
            "role = \"response\"",
            "role = \"response\"\naccess = \"remote-write\"",
        ),
        "access = \"remote-write\"",
        "region \"response\" access",
        "takes no access key",
    );
    refused(
        &edit("bytes = \"01 02\"", "bytes = \"012\""),
        "bytes = \"012\"",
        "static \"blk\" bytes",
        "odd number of hex digits",
    );
    refused(
        &edit("bytes = \"01 02\"", "bytes = \"0g\""),
        "bytes = \"0g\"",
        "static \"blk\" bytes",
        "expected hex digits",
    );
    refused(
        &edit("len = 16\n", "len = 1\n"),
        "bytes = \"01 02\"",
        "static \"blk\" bytes",
        "2 bytes given for a block of len = 1",
    );
    refused(
        &edit("len = 16\n", "len = 16777217\n"),
        "len = 16777217",
        "static \"blk\" len",
        "more than 16777216 bytes",
    );
    refused(
        &edit("len = 16\nbytes = \"01 02\"\n", ""),
        "[[static]]\nname = \"blk\"",
        "static \"blk\" len",
        "needs len, bytes, or both",
    );
    refused(
        &edit(
            "iterations = { kind = \"bounded\", invocations = 1, wqes_per_invocation = 5 }",
            "iterations = { kind = \"recycled\", invocations = 1 }",
        ),
        "iterations",
        "iterations.invocations",
        "does not apply to recycled iterations",
    );
    refused(
        &edit(
            "iterations = { kind = \"bounded\", invocations = 1, wqes_per_invocation = 5 }",
            "iterations = { kind = \"bounded\", invocations = 1 }",
        ),
        "iterations",
        "iterations.wqes_per_invocation",
        "bounded iterations need this key",
    );
    refused(
        &edit(
            "name = \"key\"\nlen = 6",
            "name = \"key\"\nlen = 6\noffset = 4294967295",
        ),
        "len = 6\noffset",
        "param \"key\" len",
        "past 2^32",
    );
    refused(
        &edit("summary = ", "trigger_len = 5\nsummary = "),
        "trigger_len = 5",
        "trigger_len",
        "5 bytes, but the parameters reach byte 6",
    );
}

#[test]
fn oversize_text_is_refused_before_parsing() {
    let text = format!(
        "{TINY}{}",
        "#".repeat(usize::try_from(MAX_FILE_BYTES).unwrap())
    );
    let e = parse_definition(&text, "t.toml").unwrap_err().to_string();
    assert!(
        e.starts_with("t.toml: larger than the 1048576-byte limit"),
        "{e}"
    );
}
