//! `containerd-shim-nri-shim-v2`: see the `nri_shim` crate docs.

fn main() {
    nri_shim::main()
}
