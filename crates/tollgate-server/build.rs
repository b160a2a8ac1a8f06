//! Compiles `proto/tollgate/v1/tollgate.proto` (tollgate's own gRPC API)
//! into Rust messages, a server trait and a client, with protox: pure Rust,
//! no `protoc` needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/tollgate/v1/tollgate.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    println!("cargo:rerun-if-changed=build.rs");
    let fds = protox::compile([PROTO], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
