//! Generates bindings to the system's `infiniband/verbs.h` and compiles the
//! shim that exports its `static inline` functions (ibv_post_send,
//! ibv_poll_cq, ...), which bindgen cannot bind. Without the `rdma` feature
//! it does nothing, so the workspace builds on hosts without rdma-core.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rerun-if-changed=src/wrapper.h");
    #[cfg(feature = "rdma")]
    generate();
}

#[cfg(feature = "rdma")]
fn generate() {
    use std::path::PathBuf;
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let have_mlx5dv = std::path::Path::new("/usr/include/infiniband/mlx5dv.h").exists()
        || std::env::var("DMKIT_MLX5DV").is_ok();
    let mut b = bindgen::Builder::default()
        .header("src/wrapper.h")
        .allowlist_function("ibv_.*")
        .allowlist_function("dmkit_ibv_.*")
        .allowlist_type("ibv_.*")
        .allowlist_var("IBV_.*")
        .bitfield_enum("ibv_access_flags")
        .bitfield_enum("ibv_send_flags")
        .bitfield_enum("ibv_qp_attr_mask")
        .bitfield_enum("ibv_rereg_mr_flags")
        .rustified_enum("ibv_wc_status")
        .rustified_enum("ibv_wc_opcode")
        .rustified_enum("ibv_wr_opcode")
        .rustified_enum("ibv_qp_state")
        .rustified_enum("ibv_qp_type")
        .rustified_enum("ibv_mtu")
        .rustified_enum("ibv_port_state")
        .derive_default(true)
        .derive_debug(true)
        .prepend_enum_name(false)
        .layout_tests(false)
        .generate_comments(false);
    if have_mlx5dv {
        b = b.clang_arg("-DDMKIT_HAVE_MLX5DV");
    }
    let bindings = b
        .generate()
        .expect("bindgen over <infiniband/verbs.h>: install libibverbs-dev (and libclang-dev)");
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings");
    cc::Build::new()
        .file("src/shim.c")
        .flag_if_supported("-Wno-unused-parameter")
        .compile("dmkit_verbs_shim");
    println!("cargo:rustc-link-lib=ibverbs");
}
