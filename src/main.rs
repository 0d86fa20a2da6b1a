fn main() -> std::process::ExitCode {
    questdb_operator::app::main()
}
