//! The documentation's links: every relative link of the README, `docs/` and the chart's README
//! names a file that exists and, with `#anchor`, a heading that page has. A page moved or a
//! heading renamed fails here, not in front of a user following the link.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn markdown_files() -> Vec<PathBuf> {
    let mut out = vec![
        repo().join("README.md"),
        repo().join("charts/questdb-operator/README.md"),
    ];
    let mut dirs = vec![repo().join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.push(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of `[text](target)` outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        // Code spans hold examples, not links.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect();
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    out
}

#[test]
fn every_documentation_link_leads_to_a_page_and_heading_that_exist() {
    let mut broken = Vec::new();
    for page in markdown_files() {
        let text = std::fs::read_to_string(&page).expect("page");
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") || link.contains(' ') {
                continue;
            }
            let (file, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap_or(Path::new(".")).join(file)
            };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", page.display()));
                continue;
            }
            if !fragment.is_empty() {
                let target_text = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&target_text).iter().any(|a| a == fragment) {
                    broken.push(format!("{}: {link} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The README stays an entry point: what the operator is, the two set-up commands, a first
/// database and where to read on; the rest lives in `docs/`.
#[test]
fn the_readme_is_an_entry_point_and_links_every_documentation_page() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README");
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines: move detail to docs/"
    );
    let index = std::fs::read_to_string(repo().join("docs/README.md")).expect("docs/README.md");
    for page in markdown_files() {
        let Ok(rel) = page.strip_prefix(repo().join("docs")) else {
            continue;
        };
        let rel = rel.to_string_lossy();
        if rel == "README.md" {
            continue;
        }
        assert!(
            index.contains(&format!("]({rel}")),
            "docs/README.md does not link {rel}"
        );
    }
}

/// The flags reference (docs/reference/flags.md) has a row for every flag of `run` and no row
/// for a flag `run` does not have, each with its environment variable: a flag added, renamed or
/// removed in the code without the page fails here.
#[test]
fn the_flags_reference_lists_exactly_runs_flags_and_their_environment_variables() {
    use clap::CommandFactory;
    let page = std::fs::read_to_string(repo().join("docs/reference/flags.md")).expect("flags.md");
    // The `run` table: from its heading line to the next blank line after the table.
    let start = page.find("`questdb-operator run`:").expect("the run table");
    let table: Vec<&str> = page[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .collect();
    let documented: std::collections::BTreeMap<String, String> = table
        .iter()
        .filter_map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let flag = cells.get(1)?.trim_matches('`').strip_prefix("--")?;
            // The header's separator row (`|---|`) is not a flag.
            if !flag.starts_with(|c: char| c.is_ascii_alphabetic()) {
                return None;
            }
            Some((
                flag.to_string(),
                cells.get(2)?.trim_matches('`').to_string(),
            ))
        })
        .collect();
    let cli = questdb_operator::cli::Cli::command();
    let run = cli.find_subcommand("run").expect("run");
    let cli = &cli;
    let mut problems = Vec::new();
    let mut flags = std::collections::BTreeSet::new();
    // `run`'s own flags and the global ones (`--log-format`), which `run` takes too.
    for arg in run.get_arguments().chain(cli.get_arguments()) {
        let (Some(long), false) = (arg.get_long(), arg.is_hide_set()) else {
            continue;
        };
        if long == "help" {
            continue;
        }
        flags.insert(long.to_string());
        let env = arg
            .get_env()
            .map(|e| e.to_string_lossy().to_string())
            .unwrap_or_default();
        match documented.get(long) {
            None => problems.push(format!("--{long}: no row")),
            Some(e) if *e != env => {
                problems.push(format!("--{long}: env {e:?}, the code's {env:?}"))
            }
            Some(_) => {}
        }
    }
    for flag in documented.keys() {
        if !flags.contains(flag) {
            problems.push(format!("--{flag}: a row for a flag `run` does not have"));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/reference/flags.md drifted:\n{}",
        problems.join("\n")
    );
}
