//! The `vllm-sim` binary (also installed as `vllm` in the simulator image): `vllm-sim serve
//! MODEL [flags]`, the same command line as `vllm serve`.

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(sparkgate_tests::sim::main(&argv));
}
