//! The JSONPath subset of CRD `additionalPrinterColumns` and `selectableFields`
//! (`.spec.mode`, `.metadata['name']`, `.items[0]`, `.items[*].x`,
//! `.status.conditions[?(@.type=="Ready")].reason`), as kubectl's table columns need it.

use serde_json::Value;

/// One step of a path.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// `.name` or `['name']`.
    Field(String),
    /// `[n]`.
    Index(usize),
    /// `[*]` or `.*`.
    All,
    /// `[?(@.a.b == literal)]` (or `!=`).
    Filter { path: Vec<String>, equal: bool, literal: Value },
}

/// A parsed path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JsonPath {
    steps: Vec<Step>,
}

fn literal(s: &str) -> Result<Value, String> {
    let s = s.trim();
    if let Some(inner) = s.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        return Ok(Value::String(inner.to_owned()));
    }
    if let Some(inner) = s.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
        return Ok(Value::String(inner.to_owned()));
    }
    serde_json::from_str(s).map_err(|_| format!("unrecognized literal {s:?}"))
}

impl JsonPath {
    /// Parses `.a.b[0]` (an optional surrounding `{...}` is accepted).
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut rest = text.trim();
        if let Some(inner) = rest.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
            rest = inner.trim();
        }
        if !rest.starts_with('.') && !rest.starts_with('[') {
            return Err(format!("{text:?} must start with '.' or '['"));
        }
        let mut steps = Vec::new();
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix('.') {
                let end = r.find(['.', '[']).unwrap_or(r.len());
                let name = &r[..end];
                if name.is_empty() {
                    return Err(format!("{text:?}: empty field name"));
                }
                steps.push(if name == "*" { Step::All } else { Step::Field(name.to_owned()) });
                rest = &r[end..];
            } else if let Some(r) = rest.strip_prefix('[') {
                let end = find_close(r).ok_or_else(|| format!("{text:?}: unterminated ["))?;
                let inner = r[..end].trim();
                rest = &r[end + 1..];
                steps.push(if inner == "*" {
                    Step::All
                } else if let Some(filter) =
                    inner.strip_prefix("?(").and_then(|f| f.strip_suffix(')'))
                {
                    let (lhs, rhs, equal) = if let Some((l, r)) = filter.split_once("!=") {
                        (l, r, false)
                    } else if let Some((l, r)) = filter.split_once("==") {
                        (l, r, true)
                    } else {
                        return Err(format!("{text:?}: only == and != filters are supported"));
                    };
                    let path = lhs
                        .trim()
                        .strip_prefix('@')
                        .ok_or_else(|| format!("{text:?}: a filter starts with @"))?;
                    Step::Filter {
                        path: path
                            .split('.')
                            .filter(|s| !s.is_empty())
                            .map(str::to_owned)
                            .collect(),
                        equal,
                        literal: literal(rhs)?,
                    }
                } else if inner.starts_with('\'') || inner.starts_with('"') {
                    match literal(inner)? {
                        Value::String(s) => Step::Field(s),
                        _ => return Err(format!("{text:?}: bad field name")),
                    }
                } else {
                    Step::Index(
                        inner
                            .parse()
                            .map_err(|_| format!("{text:?}: unsupported subscript [{inner}]"))?,
                    )
                });
            } else {
                return Err(format!("{text:?}: unexpected {rest:?}"));
            }
        }
        Ok(Self { steps })
    }

    /// Whether the path is a plain field chain (`.a.b`), as selectable fields must be.
    pub(crate) fn fields(&self) -> Option<Vec<&str>> {
        self.steps
            .iter()
            .map(|s| match s {
                Step::Field(f) => Some(f.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Every value the path selects in `root`.
    pub(crate) fn find<'a>(&self, root: &'a Value) -> Vec<&'a Value> {
        let mut current = vec![root];
        for step in &self.steps {
            let mut next = Vec::new();
            for v in current {
                match step {
                    Step::Field(f) => next.extend(v.get(f)),
                    Step::Index(i) => next.extend(v.get(*i)),
                    Step::All => match v {
                        Value::Array(a) => next.extend(a.iter()),
                        Value::Object(m) => next.extend(m.values()),
                        _ => {}
                    },
                    Step::Filter { path, equal, literal } => {
                        if let Value::Array(a) = v {
                            next.extend(a.iter().filter(|item| {
                                let found = path.iter().try_fold(*item, |cur, f| cur.get(f));
                                (found == Some(literal)) == *equal
                            }));
                        }
                    }
                }
            }
            current = next;
        }
        current
    }
}

fn find_close(s: &str) -> Option<usize> {
    let mut depth = 0_i32;
    let mut quote: Option<char> = None;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '\'' | '"') => quote = Some(c),
            (None, '[' | '(') => depth += 1,
            (None, ']') if depth == 0 => return Some(i),
            (None, ']' | ')') => depth -= 1,
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths() {
        let obj = json!({"spec": {"parents": ["eth1", "eth2"], "a.b": 1},
            "status": {"conditions": [{"type": "Other", "reason": "X"}, {"type": "Ready", "reason": "Ready"}]}});
        let find = |p: &str| {
            JsonPath::parse(p).unwrap().find(&obj).into_iter().cloned().collect::<Vec<_>>()
        };
        assert_eq!(find(".spec.parents"), [json!(["eth1", "eth2"])]);
        assert_eq!(find(".spec.parents[1]"), [json!("eth2")]);
        assert_eq!(find(".spec.parents[*]"), [json!("eth1"), json!("eth2")]);
        assert_eq!(find(".spec['a.b']"), [json!(1)]);
        assert_eq!(find(".status.conditions[?(@.type==\"Ready\")].reason"), [json!("Ready")]);
        assert!(find(".spec.missing").is_empty());
        assert!(JsonPath::parse("spec").is_err());
        assert_eq!(
            JsonPath::parse(".spec.nodeName").unwrap().fields(),
            Some(vec!["spec", "nodeName"])
        );
    }
}
