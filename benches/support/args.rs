//! The benches' command lines: `--flag value` or `--flag=value`.

use anyhow::Context;

/// The flags after the binary's name, each with its value when it is one of `with_value`;
/// `--bench`, which cargo passes to every bench binary, is left out.
pub fn flags(with_value: &[&str]) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let mut out = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        if flag == "--bench" {
            continue;
        }
        let value = if with_value.contains(&flag.as_str()) {
            Some(
                inline
                    .or_else(|| args.next())
                    .with_context(|| format!("{flag} needs a value"))?,
            )
        } else {
            None
        };
        out.push((flag, value));
    }
    Ok(out)
}
