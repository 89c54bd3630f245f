//! The README's tables against the code they describe: the command table against clap's
//! command tree of this binary, the endpoint table against the router's own route list
//! (`ferrite_server::route_table`). Test-only; it must never copy either list by hand.

use clap::CommandFactory;

const README: &str = include_str!("../../../README.md");

/// The code-span first cells of the table rows under the heading `## {section}`.
fn first_cells(readme: &str, section: &str) -> Vec<String> {
    let heading = format!("## {section}");
    readme
        .lines()
        .skip_while(|l| l.trim() != heading)
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cell = &l[3..];
            cell[..cell.find('`').unwrap_or(cell.len())].to_string()
        })
        .collect()
}

/// Every command path a user can run: each subcommand, nested ones too, but not a parent
/// that requires a subcommand (`gate`).
fn command_paths(cmd: &clap::Command, prefix: &[String], out: &mut Vec<Vec<String>>) {
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let mut path = prefix.to_vec();
        path.push(sub.get_name().to_string());
        if !sub.is_subcommand_required_set() {
            out.push(path.clone());
        }
        command_paths(sub, &path, out);
    }
}

/// The command path a row names: the words after `ferrite` while they are subcommands.
fn row_path(root: &clap::Command, cell: &str) -> Vec<String> {
    let mut cmd = root;
    let mut path = Vec::new();
    for word in cell.split_whitespace().skip(1) {
        match cmd.find_subcommand(word) {
            Some(sub) => {
                path.push(word.to_string());
                cmd = sub;
            }
            None => break,
        }
    }
    path
}

/// Each problem of `readme`'s two tables, empty when they match the code.
fn mismatches(readme: &str) -> Vec<String> {
    let root = crate::Cli::command();
    let mut problems = Vec::new();
    let mut want = Vec::new();
    command_paths(&root, &[], &mut want);
    let cells = first_cells(readme, "Subcommands");
    let mut have: Vec<Vec<String>> = Vec::new();
    for cell in &cells {
        // A row may show several forms (`a` / `b`); each starts with `ferrite`.
        let path = row_path(&root, cell);
        if path.is_empty() {
            problems.push(format!("row `{cell}` names no subcommand"));
        }
        have.push(path);
    }
    for path in &want {
        if !have.contains(path) {
            problems.push(format!("no row for `ferrite {}`", path.join(" ")));
        }
    }
    let routes: Vec<String> = ferrite_server::route_table()
        .into_iter()
        .map(|(method, path)| {
            // axum writes a catch-all segment `{*id}`; users write `{id}`.
            format!(
                "{} {}",
                method.to_ascii_uppercase(),
                path.replace("{*", "{")
            )
        })
        .collect();
    let endpoints = first_cells(readme, "HTTP endpoints (`ferrite serve`)");
    for route in &routes {
        if !endpoints.contains(route) {
            problems.push(format!("no row for `{route}`"));
        }
    }
    for e in &endpoints {
        if !routes.contains(e) {
            problems.push(format!("row `{e}` is not a route"));
        }
    }
    problems
}

#[test]
fn readme_tables_match_the_cli_and_the_router() {
    let problems = mismatches(README);
    assert!(problems.is_empty(), "README.md: {problems:#?}");
    // What the check read: one row per command path and one per route.
    let mut paths = Vec::new();
    command_paths(&crate::Cli::command(), &[], &mut paths);
    assert_eq!(first_cells(README, "Subcommands").len(), paths.len());
    assert_eq!(
        first_cells(README, "HTTP endpoints (`ferrite serve`)").len(),
        ferrite_server::route_table().len()
    );
}

/// Test the test: a README with a row removed from either table fails, naming the row.
#[test]
fn a_missing_or_extra_row_is_found() {
    let drop_row = |start: &str| -> String {
        README
            .lines()
            .filter(|l| !l.starts_with(start))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let p = mismatches(&drop_row("| `ferrite bench serve"));
    assert_eq!(p, ["no row for `ferrite bench serve`"]);
    let p = mismatches(&drop_row("| `ferrite convert"));
    assert_eq!(p, ["no row for `ferrite convert`"]);
    let p = mismatches(&drop_row("| `POST /detokenize`"));
    assert_eq!(p, ["no row for `POST /detokenize`"]);
    let extra = README.replace(
        "| `POST /tokenize` |",
        "| `POST /v1/embeddings` | made up |\n| `POST /tokenize` |",
    );
    assert_eq!(
        mismatches(&extra),
        ["row `POST /v1/embeddings` is not a route"]
    );
}
