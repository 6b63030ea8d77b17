//! Shared by the tests of the image (`make image`): reads the repository's Dockerfile the way
//! a builder would (its runtime stage's config, its global ARGs, each stage's RUN lines) and
//! finds the OCI archive `make image` wrote, so a test can compare the two or run the image.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::repo;

/// `target/image/netclaim-<version>.oci.tar`; fails naming `make image` when it is missing
/// (the tests that need it are `#[ignore]`d and run by `make test`, which builds it).
pub fn archive() -> PathBuf {
    let path = repo().join(format!("target/image/netclaim-{}.oci.tar", netclaim::testing::VERSION));
    assert!(path.exists(), "{} is missing: run `make image` (make test does)", path.display());
    path
}

/// The name the archive carries (`io.containerd.image.name`) and the manifests use.
pub fn image_ref() -> String {
    format!("localhost/netclaim:{}", netclaim::testing::VERSION)
}

/// One stage of a Dockerfile.
#[derive(Debug, Default)]
pub struct Stage {
    /// `AS <name>`.
    pub name: String,
    /// The image it starts from.
    pub from: String,
    /// `ARG`s in scope, substituted.
    pub args: BTreeMap<String, String>,
    /// `RUN` lines, continuations joined.
    pub runs: Vec<String>,
    /// `ENTRYPOINT` (exec form).
    pub entrypoint: Option<Vec<String>>,
    /// `CMD` (exec form).
    pub cmd: Option<Vec<String>>,
    /// `ENV`, in order, later ones replacing earlier ones.
    pub env: Vec<(String, String)>,
    /// `LABEL`s.
    pub labels: BTreeMap<String, String>,
    /// `EXPOSE`d ports as `<port>/<proto>`.
    pub ports: Vec<String>,
    /// `USER`.
    pub user: Option<String>,
    /// `WORKDIR`.
    pub workdir: Option<String>,
}

/// A parsed Dockerfile.
#[derive(Debug, Default)]
pub struct Dockerfile {
    /// ARGs before the first FROM, with their defaults.
    pub global_args: BTreeMap<String, String>,
    /// The stages in order.
    pub stages: Vec<Stage>,
}

impl Dockerfile {
    /// Parses `path`; `build_args` override ARG defaults (as `--build-arg`).
    pub fn read(path: &Path, build_args: &[(&str, &str)]) -> Self {
        let text = std::fs::read_to_string(path).unwrap();
        let build_args: BTreeMap<String, String> =
            build_args.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let mut file = Dockerfile::default();
        for (keyword, rest) in instructions(&text) {
            if keyword == "FROM" {
                let words: Vec<&str> = rest.split_whitespace().collect();
                let name = match words.as_slice() {
                    [_, as_, name] if as_.eq_ignore_ascii_case("as") => (*name).to_owned(),
                    _ => file.stages.len().to_string(),
                };
                file.stages.push(Stage {
                    name,
                    from: substitute(words[0], &file.global_args),
                    ..Stage::default()
                });
                continue;
            }
            if keyword == "ARG" {
                let (name, default) = match rest.split_once('=') {
                    Some((name, default)) => (name.to_owned(), Some(words(default).join(" "))),
                    None => (rest.clone(), None),
                };
                match file.stages.last_mut() {
                    None => {
                        let value = build_args.get(&name).cloned().or(default).unwrap_or_default();
                        file.global_args.insert(name, value);
                    }
                    Some(stage) => {
                        let value = build_args
                            .get(&name)
                            .cloned()
                            .or(default)
                            .or_else(|| file.global_args.get(&name).cloned())
                            .unwrap_or_else(|| panic!("ARG {name} has no value"));
                        stage.args.insert(name, value);
                    }
                }
                continue;
            }
            let stage = file.stages.last_mut().expect("instructions after FROM");
            let args = stage.args.clone();
            match keyword.as_str() {
                "RUN" => stage.runs.push(rest),
                "ENTRYPOINT" => stage.entrypoint = Some(exec_form(&rest)),
                "CMD" => stage.cmd = Some(exec_form(&rest)),
                "ENV" => {
                    for (key, value) in key_values(&rest, &args) {
                        stage.env.retain(|(k, _)| *k != key);
                        stage.env.push((key, value));
                    }
                }
                "LABEL" => stage.labels.extend(key_values(&rest, &args)),
                "EXPOSE" => stage.ports.extend(
                    rest.split_whitespace()
                        .map(|p| if p.contains('/') { p.to_owned() } else { format!("{p}/tcp") }),
                ),
                "USER" => stage.user = Some(substitute(&rest, &args)),
                "WORKDIR" => stage.workdir = Some(substitute(&rest, &args)),
                _ => {}
            }
        }
        file
    }

    /// The stage named `name`.
    pub fn stage(&self, name: &str) -> &Stage {
        self.stages
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("the Dockerfile has no stage {name}"))
    }
}

/// `(KEYWORD, arguments)` per instruction: comments dropped, continuation lines joined.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut result = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (current.is_empty() && trimmed.is_empty()) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(trimmed);
        let (keyword, rest) = current.split_once(' ').unwrap_or((&current, ""));
        result.push((keyword.to_ascii_uppercase(), rest.trim().to_owned()));
        current.clear();
    }
    assert!(current.is_empty(), "the Dockerfile ends inside a continued line");
    result
}

/// `$NAME` and `${NAME}` replaced from `args`; an undeclared name fails.
fn substitute(value: &str, args: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, tail) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').expect("closing brace");
            (&braced[..end], &braced[end + 1..])
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        out.push_str(args.get(name).unwrap_or_else(|| panic!("${name} is not an ARG in scope")));
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// Shell-like words: whitespace-separated, with double or single quotes.
fn words(text: &str) -> Vec<String> {
    let mut result = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => word.extend(chars.next()),
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '\\') => {
                word.extend(chars.next());
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    result.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    assert!(quote.is_none(), "unclosed quote in {text:?}");
    if in_word {
        result.push(word);
    }
    result
}

/// `KEY=VALUE ...` pairs, values substituted.
fn key_values(text: &str, args: &BTreeMap<String, String>) -> Vec<(String, String)> {
    words(text)
        .into_iter()
        .map(|word| {
            let (key, value) =
                word.split_once('=').unwrap_or_else(|| panic!("expected KEY=VALUE: {word}"));
            (key.to_owned(), substitute(value, args))
        })
        .collect()
}

/// The exec (JSON) form; the image has no shell for the other one.
fn exec_form(text: &str) -> Vec<String> {
    serde_json::from_str(text).unwrap_or_else(|e| {
        panic!("{text} is not the exec (JSON) form, which a shell-less image needs: {e}")
    })
}
