//! Lists the worker package's files so `worker_files.rs` embeds them all.

use std::fs;
use std::path::Path;

fn main() {
    // Read at run time, not baked in with env!(): a build script compiled in
    // another checkout (a copied target directory, a worktree) must still
    // embed this checkout's worker.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    let dir = Path::new(&manifest).join("../../python/cellhost_worker");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut names: Vec<String> = fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".py"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let mut code = String::from(
        "/// The worker package: (file name, source).\npub(crate) const WORKER_FILES: &[(&str, &str)] = &[\n",
    );
    for n in &names {
        let path = dir.join(n);
        println!("cargo:rerun-if-changed={}", path.display());
        code.push_str(&format!(
            "    ({n:?}, include_str!({:?})),\n",
            path.display().to_string()
        ));
    }
    code.push_str("];\n");
    let out = Path::new(&std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into())).join("worker_files.rs");
    if let Err(e) = fs::write(&out, code) {
        panic!("cannot write {}: {e}", out.display());
    }
}
