//! The directory loader: it sorts, skips what is not a definition and checks names.

use super::*;

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("redn-definitions-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.0.join(name), text).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_directory_loader_sorts_skips_and_checks_names() {
    let d = TempDir::new("dir");
    let echo = catalog::echo(8, 1).unwrap();
    d.write("tiny.toml", TINY);
    d.write("echo.toml", &write_definition(&echo));
    d.write("README", "not a definition");
    d.write(".tiny.toml.swp", "editor junk");
    d.write("echo.toml~", "backup");
    let programs = load_offloads_dir(&d.0).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(programs, vec![echo.clone(), tiny()]);

    d.write("zz.toml", TINY);
    let e = load_offloads_dir(&d.0).unwrap_err().to_string();
    let want = format!("{}:2:1: name: the offload is called \"tiny\" but its file is zz.toml; name the file tiny.toml", d.0.join("zz.toml").display());
    assert_eq!(e, want);
    std::fs::remove_file(d.0.join("zz.toml")).unwrap();

    d.write(
        "broken.toml",
        &TINY
            .replace("name = \"tiny\"", "name = \"broken\"")
            .replace("count = 0", "count = x"),
    );
    let e = load_offloads_dir(&d.0).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "{}:{}:",
            d.0.join("broken.toml").display(),
            line_of(TINY, "count = 0")
        )),
        "{e}"
    );

    let e = load_offloads_dir(d.0.join("missing"))
        .unwrap_err()
        .to_string();
    assert!(e.ends_with("missing: cannot read the file"), "{e}");
}
