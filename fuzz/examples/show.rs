//! Shows what a llkv_structured input builds: the plan, the LLKV1 file it makes and what
//! decode says about it; with a second argument, writes that file (to replay it on the
//! byte-level targets). Run:
//!   cargo run --manifest-path fuzz/Cargo.toml --example show -- INPUT [OUT]
use arbitrary::{Arbitrary, Unstructured};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let data = std::fs::read(&args[1]).expect("read input");
    let plan = kvmem_fuzz::Plan::arbitrary_take_rest(Unstructured::new(&data)).expect("plan");
    println!("{plan:#?}");
    let (file, _) = kvmem_fuzz::build(&plan);
    let end = file
        .windows(2)
        .position(|w| w == b"\n\n")
        .map_or(file.len(), |e| e + 2);
    println!("--- header ({} bytes of {}):", end, file.len());
    println!("{:?}", String::from_utf8_lossy(&file[..end]));
    for limits in kvmem_fuzz::LIMITS {
        match kvmem_fuzz::snapshot::decode(&file, limits) {
            Ok(s) => println!(
                "decode {limits:?}: ok {:?} tokens={} state={}B",
                s.header,
                s.token_ids.len(),
                s.state.len()
            ),
            Err(e) => println!("decode {limits:?}: {e}"),
        }
    }
    if let Some(out) = args.get(2) {
        std::fs::write(out, &file).expect("write");
    }
}
