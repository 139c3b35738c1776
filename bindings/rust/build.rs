// Links liblowbit from LOWBIT_LIB_DIR (the directory of liblowbit.so; default
// ../../build, this repository's build directory) and sets an rpath to it,
// so that the tests and examples run without LD_LIBRARY_PATH.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LOWBIT_LIB_DIR");
    println!("cargo:rerun-if-changed=build.rs");
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let dir = match env::var_os("LOWBIT_LIB_DIR") {
        Some(d) if !d.is_empty() => manifest.join(PathBuf::from(d)), // absolute stays absolute
        _ => manifest.join("../../build"),
    };
    let dir = dir.canonicalize().unwrap_or(dir);
    let lib = dir.join(format!("{}lowbit{}", env::consts::DLL_PREFIX, env::consts::DLL_SUFFIX));
    if !lib.exists() {
        println!(
            "cargo:warning={} does not exist: set LOWBIT_LIB_DIR to the directory of liblowbit (cmake --build build --target lowbit)",
            lib.display()
        );
    }
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=lowbit");
    if env::var("CARGO_CFG_TARGET_OS")
        .map(|os| os != "windows")
        .unwrap_or(true)
    {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
}
