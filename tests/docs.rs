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

// Generated references: each page keeps a hand-written introduction above the marker line and
// the part below it is what the code says. A test builds that part from the code and compares;
// `QDB_BLESS_DOCS=1` rewrites it instead.

const MARKER: &str =
    "<!-- generated below by tests/docs.rs; QDB_BLESS_DOCS=1 cargo test --test docs rewrites it -->";

/// Compares the generated part of `page` (below [`MARKER`]) with `generated`, or rewrites it
/// when `QDB_BLESS_DOCS=1`. A drift fails with the lines that differ.
fn check_generated(page: &str, generated: &str) {
    let path = repo().join(page);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let (intro, below) = match text.find(MARKER) {
        Some(at) => (
            &text[..at],
            text[at + MARKER.len()..].trim_start_matches('\n'),
        ),
        None => (text.as_str(), ""),
    };
    if std::env::var("QDB_BLESS_DOCS").is_ok_and(|v| v == "1") {
        let intro = intro.trim_end();
        let rewritten = format!("{intro}\n\n{MARKER}\n\n{generated}");
        std::fs::write(&path, rewritten).expect("write the page");
        return;
    }
    assert!(
        text.contains(MARKER),
        "{page} has no marker line `{MARKER}`: add it below the introduction and run \
         `QDB_BLESS_DOCS=1 cargo test --test docs`"
    );
    let first_line = text.len() - below.len();
    let offset = text[..first_line].lines().count();
    assert!(
        below == generated,
        "{page} drifted from the code (- the page's line, + the code's, numbered as the \
         page's lines); `QDB_BLESS_DOCS=1 cargo test --test docs` rewrites it:\n{}",
        line_diff(below, generated, offset)
    );
}

/// The lines that differ between `old` and `new` (longest common subsequence), at most 80 of
/// them, each numbered as the line of `old` it replaces or precedes, plus `offset`.
fn line_diff(old: &str, new: &str, offset: usize) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            out.push(format!("+{:>5} {}", offset + i + 1, b[j]));
            j += 1;
        } else {
            out.push(format!("-{:>5} {}", offset + i + 1, a[i]));
            i += 1;
        }
    }
    let more = out.len().saturating_sub(80);
    out.truncate(80);
    if more > 0 {
        out.push(format!("... and {more} more"));
    }
    out.join("\n")
}

/// A table cell: one line, `|` escaped, and `<` outside code spans escaped so a `<name>` is
/// shown rather than taken for HTML.
fn cell(text: &str) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::new();
    let mut in_code = false;
    for c in one_line.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c);
            }
            '|' => out.push_str("\\|"),
            '<' if !in_code => out.push_str("&lt;"),
            _ => out.push(c),
        }
    }
    out
}

/// The first sentence of a description: up to the first `.` that ends a sentence (followed by
/// a space or the end, outside parentheses and code spans, not `e.g.`, `i.e.` or `etc.`).
fn first_sentence(text: &str) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let chars: Vec<char> = text.chars().collect();
    let (mut depth, mut in_code) = (0i32, false);
    for (i, c) in chars.iter().enumerate() {
        match c {
            '`' => in_code = !in_code,
            '(' if !in_code => depth += 1,
            ')' if !in_code => depth -= 1,
            '.' if !in_code && depth <= 0 && chars.get(i + 1).is_none_or(|n| *n == ' ') => {
                let before: String = chars[..i].iter().collect();
                let word = before.rsplit(' ').next().unwrap_or("");
                if !["e.g", "i.e", "etc", "vs"].contains(&word.trim_start_matches('(')) {
                    return before + ".";
                }
            }
            _ => {}
        }
    }
    text
}

// The CRD reference.

/// The schema of `T` as schemars writes it before kube inlines it: every named type is still a
/// `$ref`, so a field whose type is Kubernetes' own (`io.k8s.*`) can be told from ours.
fn typed_schema<T: schemars::JsonSchema>() -> serde_json::Value {
    let generator = schemars::generate::SchemaSettings::openapi3()
        .with(|s| s.meta_schema = None)
        .into_generator();
    serde_json::to_value(generator.into_root_schema_for::<T>()).expect("schema")
}

enum Typed<'a> {
    /// A Kubernetes API type (its short name and schema): listed, not expanded.
    Kubernetes(&'a str, &'a serde_json::Value),
    Ours(&'a serde_json::Value),
    Unknown,
}

/// Follows `$ref`s (and a `$ref` wrapped in `allOf`/`anyOf`/`oneOf` beside `null`) to the
/// schema of a field's type.
fn resolve<'a>(schema: Option<&'a serde_json::Value>, root: &'a serde_json::Value) -> Typed<'a> {
    let Some(mut s) = schema else {
        return Typed::Unknown;
    };
    'follow: loop {
        if let Some(r) = s.get("$ref").and_then(|r| r.as_str()) {
            let name = r.rsplit('/').next().unwrap_or(r);
            let Some(def) = r.strip_prefix('#').and_then(|p| root.pointer(p)) else {
                return Typed::Unknown;
            };
            if name.starts_with("io.k8s.") {
                return Typed::Kubernetes(name.rsplit('.').next().unwrap_or(name), def);
            }
            s = def;
            continue;
        }
        for key in ["allOf", "anyOf", "oneOf"] {
            if let Some(branches) = s.get(key).and_then(|b| b.as_array()) {
                let null = |b: &serde_json::Value| {
                    b["type"] == "null" || b["enum"] == serde_json::json!([null])
                };
                let real: Vec<&serde_json::Value> = branches.iter().filter(|b| !null(b)).collect();
                if let [only] = real[..] {
                    if only.get("$ref").is_some() {
                        s = only;
                        continue 'follow;
                    }
                }
            }
        }
        return Typed::Ours(s);
    }
}

fn child<'a>(typed: &Typed<'a>, key: &str, name: Option<&str>) -> Option<&'a serde_json::Value> {
    let Typed::Ours(s) = typed else { return None };
    match name {
        Some(name) => s.get(key)?.get(name),
        None => s.get(key),
    }
}

/// A field's type as the page spells it: `string`, `[]string`, `map[string]string`, `object`,
/// or a Kubernetes type's name (`[]Toleration`, `ResourceRequirements`).
fn field_type(crd: &serde_json::Value, typed: &Typed, root: &serde_json::Value) -> String {
    if let Typed::Kubernetes(name, _) = typed {
        return (*name).to_string();
    }
    if crd["x-kubernetes-int-or-string"] == true {
        return "int-or-string".into();
    }
    match crd["type"].as_str() {
        Some("array") => {
            let items = resolve(child(typed, "items", None), root);
            format!("[]{}", field_type(&crd["items"], &items, root))
        }
        Some("object") if crd["additionalProperties"].is_object() => {
            let values = resolve(child(typed, "additionalProperties", None), root);
            format!(
                "map[string]{}",
                field_type(&crd["additionalProperties"], &values, root)
            )
        }
        Some("object")
            if crd["properties"].is_null()
                && crd["x-kubernetes-preserve-unknown-fields"] == true =>
        {
            "object (any fields)".into()
        }
        Some(t) => match crd["format"].as_str() {
            Some(format) => format!("{t} ({format})"),
            None => t.to_string(),
        },
        None => "any".into(),
    }
}

/// One row per field below `crd` (the CRD's schema at `path`), descending into the operator's
/// own types and stopping at Kubernetes' (named, not expanded).
fn field_rows(
    crd: &serde_json::Value,
    typed: &Typed,
    root: &serde_json::Value,
    path: &str,
    deprecated: Option<&str>,
    rows: &mut Vec<String>,
) {
    if matches!(typed, Typed::Kubernetes(..)) {
        return;
    }
    if crd["type"] == "array" {
        let items = resolve(child(typed, "items", None), root);
        return field_rows(
            &crd["items"],
            &items,
            root,
            &format!("{path}[]"),
            deprecated,
            rows,
        );
    }
    if crd["additionalProperties"].is_object() {
        let values = resolve(child(typed, "additionalProperties", None), root);
        let here = format!("{path}.<key>");
        return field_rows(
            &crd["additionalProperties"],
            &values,
            root,
            &here,
            deprecated,
            rows,
        );
    }
    let Some(properties) = crd["properties"].as_object() else {
        return;
    };
    let required: Vec<&str> = crd["required"]
        .as_array()
        .map(|r| r.iter().filter_map(|n| n.as_str()).collect())
        .unwrap_or_default();
    for (name, field) in properties {
        let here = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        let typed_field = resolve(child(typed, "properties", Some(name)), root);
        // Without the field's type the walk could not tell a Kubernetes type from ours.
        assert!(
            !matches!(typed_field, Typed::Unknown),
            "{here}: not found in the schemars schema of the type (tests/docs.rs resolve)"
        );
        let mut ty = format!("`{}`", field_type(field, &typed_field, root));
        if required.contains(&name.as_str()) {
            ty.push_str(", required");
        }
        if let Some(values) = field["enum"].as_array() {
            let values: Vec<String> = values
                .iter()
                .filter_map(|v| v.as_str())
                .map(|v| format!("`{v}`"))
                .collect();
            if !values.is_empty() {
                ty.push_str(&format!(", one of {}", values.join(", ")));
            }
        }
        let default = match &field["default"] {
            serde_json::Value::Null => String::new(),
            serde_json::Value::String(s) => format!("`{s}`"),
            other => format!("`{other}`"),
        };
        let mut description = field["description"].as_str().unwrap_or("").to_string();
        // A Kubernetes-typed field without a comment of its own carries the type's description.
        if let Typed::Kubernetes(_, def) = &typed_field {
            if def["description"].as_str() == Some(description.as_str()) {
                description.clear();
            }
        }
        let mut description = first_sentence(&description);
        let own_deprecation = description.starts_with("Deprecated");
        if let (Some(parent), false) = (deprecated, own_deprecation) {
            description = format!("Deprecated with `{parent}`. {description}");
        }
        rows.push(format!(
            "| `{here}` | {} | {} | {} |",
            cell(&ty),
            cell(&default),
            cell(description.trim())
        ));
        let deprecated = deprecated.or(own_deprecation.then_some(here.as_str()));
        field_rows(field, &typed_field, root, &here, deprecated, rows);
    }
}

/// The page below the marker: per CRD `questdb-operator crd` prints, its names and a row per
/// field of its spec and status.
fn crd_reference() -> String {
    let mut out = String::new();
    for crd in questdb_operator::crd::all() {
        let kind = crd.spec.names.kind.clone();
        let typed = match kind.as_str() {
            "QuestDB" => typed_schema::<questdb_operator::api::QuestDB>(),
            "QuestDBBackup" => typed_schema::<questdb_operator::api::QuestDBBackup>(),
            "QuestDBBackupSchedule" => {
                typed_schema::<questdb_operator::api::QuestDBBackupSchedule>()
            }
            other => panic!("a CRD of kind {other}: add its type to tests/docs.rs crd_reference"),
        };
        let names = &crd.spec.names;
        let short: Vec<String> = names
            .short_names
            .iter()
            .flatten()
            .map(|s| format!("`{s}`"))
            .collect();
        for version in &crd.spec.versions {
            out.push_str(&format!("## `{kind}`\n\n"));
            out.push_str(&format!(
                "`{}/{}`, {}, plural `{}`{}.",
                crd.spec.group,
                version.name,
                crd.spec.scope.to_lowercase(),
                names.plural,
                if short.is_empty() {
                    String::new()
                } else {
                    format!(", short names {}", short.join(", "))
                }
            ));
            let columns: Vec<String> = version
                .additional_printer_columns
                .iter()
                .flatten()
                .map(|c| format!("`{}` (`{}`)", c.name.to_uppercase(), c.json_path))
                .collect();
            if !columns.is_empty() {
                out.push_str(&format!(" `kubectl get` columns: {}.", columns.join(", ")));
            }
            out.push_str("\n\n| field | type | default | description |\n|---|---|---|---|\n");
            let schema = version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .expect("a schema");
            let schema = serde_json::to_value(schema).expect("schema");
            let mut rows = Vec::new();
            // The root's `spec` and `status` (apiVersion, kind and metadata are every object's).
            let mut top = schema.clone();
            top["properties"]
                .as_object_mut()
                .expect("properties")
                .retain(|name, _| name == "spec" || name == "status");
            let root_typed = resolve(Some(&typed), &typed);
            field_rows(&top, &root_typed, &typed, "", None, &mut rows);
            for row in rows {
                out.push_str(&row);
                out.push('\n');
            }
            out.push('\n');
        }
    }
    out.trim_end().to_string() + "\n"
}

/// The CRD reference (docs/reference/crd.md) lists every field of every CRD `questdb-operator
/// crd` prints, with its type and the first sentence of its description, and no field the
/// CRDs do not have: a field added, renamed, retyped or re-described in the code without the
/// page fails here.
#[test]
fn the_crd_reference_lists_every_field_the_crds_have_and_no_other() {
    check_generated("docs/reference/crd.md", &crd_reference());
}

// The conditions and events reference.

/// Intra-doc links read as code: `` [`super::SuppressionReason`] `` is `` `SuppressionReason` ``.
fn plain_doc(doc: &str) -> String {
    let mut out = String::new();
    let mut rest = doc;
    while let Some(start) = rest.find("[`") {
        let Some(len) = rest[start + 2..].find("`]") else {
            break;
        };
        let name = &rest[start + 2..start + 2 + len];
        out.push_str(&rest[..start]);
        out.push_str(&format!("`{}`", name.rsplit("::").next().unwrap_or(name)));
        rest = &rest[start + 2 + len + 2..];
    }
    out.push_str(rest);
    out
}

/// The variants of `pub enum {name}` in `source`, in order, each with its doc comment (one
/// line; empty when it has none).
fn variant_docs(source: &str, name: &str) -> Vec<(String, String)> {
    let start = source
        .find(&format!("pub enum {name} {{"))
        .unwrap_or_else(|| panic!("no `pub enum {name}`"));
    let body = &source[start..];
    let body = &body[body.find('{').expect("a body") + 1..];
    let mut doc = Vec::new();
    let mut out = Vec::new();
    for line in body.lines() {
        let line = line.trim();
        if line == "}" {
            break;
        }
        if let Some(text) = line.strip_prefix("///") {
            doc.push(text.trim().to_string());
        } else if line.is_empty() || line.starts_with("//") || line.starts_with("#[") {
            // Section comments and attributes (`#[strum(...)]`) are not a variant.
        } else {
            let variant = line.trim_end_matches(',').to_string();
            assert!(
                variant.chars().all(|c| c.is_ascii_alphanumeric()),
                "{name}: cannot read the variant line {line:?}"
            );
            out.push((variant, plain_doc(&doc.join(" "))));
            doc.clear();
        }
    }
    out
}

/// The doc comment right above `pub enum {name}` (past its attributes), one line.
fn enum_doc(source: &str, name: &str) -> String {
    let start = source
        .find(&format!("pub enum {name} "))
        .unwrap_or_else(|| panic!("no `pub enum {name}`"));
    let mut doc = Vec::new();
    for line in source[..start].lines().rev() {
        let line = line.trim();
        match line.strip_prefix("///") {
            Some(text) => doc.push(text.trim()),
            None if doc.is_empty() && !line.is_empty() && line != "}" => continue,
            None => break,
        }
    }
    doc.reverse();
    plain_doc(&doc.join(" "))
}

/// `conditions::*` in core/src/api/mod.rs: each condition type's text and its doc comment.
fn condition_type_docs(source: &str) -> std::collections::BTreeMap<String, String> {
    let start = source.find("pub mod conditions {").expect("mod conditions");
    let mut doc = Vec::new();
    let mut out = std::collections::BTreeMap::new();
    for line in source[start..].lines().skip(1) {
        let line = line.trim();
        if line == "}" {
            break;
        }
        if let Some(text) = line.strip_prefix("///") {
            doc.push(text.trim().to_string());
        } else if let Some((_, value)) = line.split_once("&str = \"") {
            let value = value.trim_end_matches("\";").to_string();
            out.insert(value, plain_doc(&doc.join(" ")));
            doc.clear();
        }
    }
    out
}

/// The enums `condition_of!` in core/src/api/reason/condition.rs gives a condition type.
fn condition_enums(source: &str) -> Vec<String> {
    let start = source.find("condition_of! {").expect("condition_of!");
    source[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.trim() != "}")
        .filter_map(|l| Some(l.split_once("=>")?.0.trim().to_string()))
        .collect()
}

fn reason_table(rows: &[(String, String)], link: Option<&str>, out: &mut String) {
    match link {
        Some(_) => out.push_str("| reason | meaning | what to do |\n|---|---|---|\n"),
        None => out.push_str("| reason | meaning |\n|---|---|\n"),
    }
    for (reason, doc) in rows {
        let doc = if doc.is_empty() { "—" } else { doc.as_str() };
        out.push_str(&format!("| `{reason}` | {}", cell(doc)));
        if let Some(link) = link {
            out.push_str(&format!(" | [runbook]({link})"));
        }
        out.push_str(" |\n");
    }
    out.push('\n');
}

/// The page below the marker: every condition type with every reason its enum has, every event
/// reason, a backup's reasons and why a failover is held back, each with the doc comment the
/// code gives it.
fn conditions_reference() -> String {
    use questdb_operator::api::*;
    let read = |path: &str| std::fs::read_to_string(repo().join(path)).expect(path);
    let condition_rs = read("core/src/api/reason/condition.rs");
    let event_rs = read("core/src/api/reason/event.rs");
    let type_docs = condition_type_docs(&read("core/src/api/mod.rs"));

    /// (enum, condition type, every reason the enum has), from the code itself.
    macro_rules! reasons {
        ($($t:ident),* $(,)?) => {
            vec![$((
                stringify!($t),
                <$t as ConditionReason>::CONDITION,
                $t::all().map($t::as_str).collect::<Vec<&str>>(),
            )),*]
        };
    }
    let conditions = reasons!(
        ReadyReason,
        SpecValidReason,
        IlpAuthReason,
        CredentialsReason,
        VolumeSizeReason,
        NodeReadyReason,
        DnsReason,
        FailoverReason,
        NodeMoveReason,
        RestoreReason,
        WriteHealthReason,
        CheckpointReason,
        BackupVerifiedReason,
        VersionUpgradeReason,
        DiskSpaceReason,
    );
    let mut listed: Vec<&str> = conditions.iter().map(|(e, _, _)| *e).collect();
    let mut in_code = condition_enums(&condition_rs);
    listed.sort_unstable();
    in_code.sort_unstable();
    assert_eq!(
        listed, in_code,
        "the condition reason enums of `condition_of!`: list each in tests/docs.rs \
         conditions_reference"
    );

    /// The variants read from the source, checked against the enum's own list.
    fn documented(source: &str, name: &str, all: Vec<&str>) -> Vec<(String, String)> {
        let docs = variant_docs(source, name);
        let read: Vec<&str> = docs.iter().map(|(v, _)| v.as_str()).collect();
        assert_eq!(read, all, "{name}: the variants read from its source");
        docs
    }

    let mut out = String::from("## Conditions\n\n");
    for (name, condition, all) in conditions {
        out.push_str(&format!("### `{condition}`\n\n"));
        let doc = type_docs.get(condition).cloned().unwrap_or_default();
        let doc = if doc.is_empty() {
            enum_doc(&condition_rs, name)
        } else {
            doc
        };
        if !doc.is_empty() && doc != format!("`{condition}`.") {
            out.push_str(&format!("{}\n\n", doc.trim()));
        }
        let anchor = anchor(&format!("`{condition}`"));
        let link = format!("../operations/runbook.md#{anchor}");
        reason_table(&documented(&condition_rs, name, all), Some(&link), &mut out);
    }

    out.push_str("## Events\n\n");
    out.push_str(&format!("{}\n\n", enum_doc(&event_rs, "EventReason")));
    let events = EventReason::all().map(EventReason::as_str).collect();
    reason_table(
        &documented(&event_rs, "EventReason", events),
        Some("../operations/runbook.md#events"),
        &mut out,
    );

    out.push_str("## Backup reasons\n\n");
    out.push_str(&format!("{}\n\n", enum_doc(&event_rs, "BackupReason")));
    let backups = BackupReason::all().map(BackupReason::as_str).collect();
    reason_table(
        &documented(&event_rs, "BackupReason", backups),
        None,
        &mut out,
    );

    out.push_str("## Failover suppressions\n\n");
    out.push_str(&format!("{}\n\n", enum_doc(&event_rs, "SuppressionReason")));
    let held = SuppressionReason::all()
        .map(SuppressionReason::as_str)
        .collect();
    reason_table(
        &documented(&event_rs, "SuppressionReason", held),
        None,
        &mut out,
    );
    out.trim_end().to_string() + "\n"
}

/// The conditions and events reference (docs/reference/conditions-and-events.md) lists every
/// reason each condition type can carry, every event reason, a backup's reasons and a held-back
/// failover's, with the code's own comment on each, and no reason the code does not have: a
/// reason added, renamed or removed in the code without the page fails here.
#[test]
fn the_conditions_and_events_reference_lists_every_reason_the_code_has_and_no_other() {
    check_generated(
        "docs/reference/conditions-and-events.md",
        &conditions_reference(),
    );
}

// The metrics reference.

/// A family as src/metrics/families.rs registers it.
#[derive(Debug)]
struct Family {
    name: String,
    kind: &'static str,
    help: String,
    labels: Vec<String>,
}

/// The Rust string literals in `code`, unescaped (`\"`, `\\`, `\n` and a `\` line continuation).
fn string_literals(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = code.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut s = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('\n') => {
                        while chars.peek().is_some_and(|c| c.is_whitespace()) {
                            chars.next();
                        }
                    }
                    Some('n') => s.push('\n'),
                    Some(other) => s.push(other),
                    None => {}
                },
                _ => s.push(c),
            }
        }
        out.push(s);
    }
    out
}

/// The arguments of the call whose `(` opens `code`, split at its top-level commas.
fn call_arguments(code: &str) -> Vec<String> {
    let (mut depth, mut in_string, mut escaped) = (0i32, false, false);
    let mut args = vec![String::new()];
    for c in code.chars() {
        let top_level = !in_string && depth == 1;
        if in_string {
            in_string = c != '"' || escaped;
            escaped = c == '\\' && !escaped;
        } else if c == '"' {
            in_string = true;
        } else if c == '(' || c == '[' {
            depth += 1;
            if depth == 1 {
                continue;
            }
        } else if c == ')' || c == ']' {
            depth -= 1;
            if depth == 0 {
                break;
            }
        } else if c == ',' && top_level {
            args.push(String::new());
            continue;
        }
        args.last_mut().expect("an argument").push(c);
    }
    args.into_iter()
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .collect()
}

/// Every family `Families::register` registers (`r.counter_vec("name", "help", labels)`, ...),
/// read from its source; labels given by name (`controller`) are its `let`s.
fn registered_families(source: &str) -> Vec<Family> {
    let kinds = [
        ("counter_vec", "counter"),
        ("counter", "counter"),
        ("float_gauge_vec", "gauge"),
        ("gauge_vec", "gauge"),
        ("gauge", "gauge"),
        ("histogram_vec", "histogram"),
        ("histogram", "histogram"),
    ];
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("r.") {
        let preceded_by_ident = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        let after = &rest[at + 2..];
        rest = after;
        if preceded_by_ident {
            continue;
        }
        let Some((method, kind)) = kinds
            .iter()
            .find(|(m, _)| after.starts_with(&format!("{m}(")))
        else {
            continue;
        };
        let args = call_arguments(&after[method.len()..]);
        let literal = |i: usize| string_literals(args.get(i).map_or("", String::as_str));
        let labels = match args.get(2) {
            Some(arg) if method.ends_with("_vec") && arg.starts_with("&[") => literal(2),
            Some(arg) if method.ends_with("_vec") => {
                let binding = format!("let {arg} = ");
                let at = source
                    .find(&binding)
                    .unwrap_or_else(|| panic!("no `{binding}` for the labels"));
                let value = &source[at + binding.len()..];
                string_literals(&value[..value.find(';').expect("a `;`")])
            }
            _ => Vec::new(),
        };
        out.push(Family {
            name: literal(0).into_iter().next().expect("a name"),
            kind,
            help: literal(1).into_iter().next().expect("a help text"),
            labels,
        });
    }
    out
}

/// The page below the marker: every family the operator registers (but the process
/// collector's), its type, labels and help text.
fn metrics_reference() -> String {
    use prometheus::core::Collector;
    let source = std::fs::read_to_string(repo().join("src/metrics/families.rs"))
        .expect("src/metrics/families.rs");
    let mut families = registered_families(&source);
    assert!(
        families.len() > 20,
        "read only {} families from src/metrics/families.rs",
        families.len()
    );

    // What was read is what a fresh registry holds: each family is there under its name (it
    // can be unregistered) with that help text and those labels (a collector with them can take
    // its place; another help or label set is refused).
    let metrics = questdb_operator::metrics::Metrics::new();
    for family in &families {
        let labels: Vec<&str> = family.labels.iter().map(String::as_str).collect();
        let probe = || -> Box<dyn Collector> {
            let opts = prometheus::Opts::new(family.name.clone(), family.help.clone());
            if labels.is_empty() {
                Box::new(prometheus::IntGauge::with_opts(opts).expect("a probe"))
            } else {
                Box::new(prometheus::IntGaugeVec::new(opts, &labels).expect("a probe"))
            }
        };
        assert!(
            metrics.registry.unregister(probe()).is_ok(),
            "{}: read from src/metrics/families.rs, not in the registry",
            family.name
        );
        if let Err(e) = metrics.registry.register(probe()) {
            panic!(
                "{}: the registry has another help text or other labels than {:?} {:?} ({e})",
                family.name, family.help, family.labels
            );
        }
    }

    // And every family a busy operator exports was read, with the type read.
    let metrics = questdb_operator::metrics::Metrics::new();
    let _controller = metrics.controller("questdb", 1);
    let second = std::time::Duration::from_secs(1);
    metrics.set_leader("questdb-operator", true);
    metrics.aws_call("ec2", "RunInstances", "ok");
    metrics.condition_transition("Ready", "True", "Running");
    metrics.failover_finished(
        questdb_operator::metrics::FailoverResult::Succeeded,
        Some(second),
    );
    metrics.node_move_finished(
        questdb_operator::metrics::NodeMoveResult::Completed,
        Some(second),
    );
    metrics.backup_finished(true, Some(second));
    metrics.last_successful_backup("ns", "db", 1);
    metrics.last_verified_backup("ns", "db", 1);
    metrics.set_checkpoint_open_seconds("ns", "db", 1);
    metrics.reconcile_error("questdb", "KubernetesApiError");
    metrics.failover_suppressed("Disabled");
    metrics.set_unhealthy_dedicated_nodes(1);
    metrics.failover_step("Fencing", second);
    metrics.node_move_step("Moving", second);
    metrics.failover_detected(second);
    metrics.orphaned_instance_terminated();
    let call = questdb_operator::metrics::ApiCall {
        verb: "get".into(),
        resource: "questdbs".into(),
    };
    metrics.record_rest_request(&call, "GET", "apiserver", Some(200), second);
    let mut unread = Vec::new();
    for exported in metrics.registry.gather() {
        let name = exported.name();
        if name.starts_with("process_") {
            continue;
        }
        let kind = match exported.get_field_type() {
            prometheus::proto::MetricType::COUNTER => "counter",
            prometheus::proto::MetricType::GAUGE => "gauge",
            prometheus::proto::MetricType::HISTOGRAM => "histogram",
            other => panic!("{name}: a {other:?}"),
        };
        match families.iter().find(|f| f.name == name) {
            Some(f) => assert_eq!(f.kind, kind, "{name}: its type"),
            None => unread.push(name.to_string()),
        }
    }
    assert!(
        unread.is_empty(),
        "exported, not read from src/metrics/families.rs: {unread:?}"
    );

    families.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::from("| family | type | labels | help |\n|---|---|---|---|\n");
    for f in &families {
        let labels: Vec<String> = f.labels.iter().map(|l| format!("`{l}`")).collect();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            f.name,
            f.kind,
            labels.join(", "),
            cell(&f.help)
        ));
    }
    out
}

/// The metrics reference (docs/reference/metrics.md) lists every family the operator registers,
/// with its type, labels and help text, and no other: a family added, renamed, relabelled or
/// removed in the code without the page fails here, before a dashboard or alert reads a name
/// that is not exported.
#[test]
fn the_metrics_reference_lists_every_family_the_operator_registers_and_no_other() {
    check_generated("docs/reference/metrics.md", &metrics_reference());
}
