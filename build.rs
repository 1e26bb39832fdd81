//! Generates the externalgrpc contract (proto/externalgrpc.proto) with protox, a pure-Rust
//! protobuf compiler, so building needs no system `protoc`. Both the server and the client are
//! generated: the server is what the operator serves, the client is what the tests dial with.

use std::error::Error;

const PROTO: &str = "proto/externalgrpc.proto";

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={PROTO}");
    let descriptors = protox::compile([PROTO], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
