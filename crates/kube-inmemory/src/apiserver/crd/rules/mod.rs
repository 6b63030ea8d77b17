//! `x-kubernetes-validations`: CEL rules compiled once when a definition is installed
//! and evaluated at the schema node that declares them, with `self` bound to that node's
//! value and `oldSelf` to the correlated old value on updates, as the real API server
//! evaluates them.
//!
//! Compiling checks what cel-go's checker would reject where it matters most: syntax,
//! unknown variables and functions, and fields the schema does not have (`self.privider`).
//! Types are not checked beyond that (a rule comparing a string with an int fails when it
//! runs, as a runtime error); there is no cost estimate or budget.
//!
//! Transition rules (those that mention `oldSelf`) run only on updates and only where an
//! old value correlates (map keys, `map` list keys), unless `optionalOldSelf` binds
//! `oldSelf` as an optional. A rule that fails at runtime is an Invalid cause at its
//! node. Failures of rules that do not use `oldSelf` on values the update did not change
//! are warnings, not errors (CRDValidationRatcheting).
//!
//! `check` checks an expression against the schema when it is compiled, `compile` turns a
//! node's entries into [`Rule`]s, and `evaluate` runs them on an object.

mod check;
mod compile;
mod evaluate;

use std::sync::{Arc, LazyLock};

use cel::{Env, Program};

use super::netlib;

pub(crate) use self::compile::compile_all;
pub(crate) use self::evaluate::{validate, validate_at};

/// The CEL environment of CRD rules: the standard library, the strings extension and
/// the Kubernetes IP, CIDR and list libraries.
pub(crate) static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    // Declaring a library on a fresh environment cannot conflict.
    env.add_extension(cel::extensions::strings).expect("the strings extension declares once");
    env.add_extension(netlib::extension).expect("the network library declares once");
    Arc::new(env)
});

/// A compiled `x-kubernetes-validations` entry.
pub(crate) struct Rule {
    /// `rule`, trimmed.
    pub(crate) source: String,
    program: Program,
    /// `message`, trimmed.
    message: Option<String>,
    /// `messageExpression` (source, program).
    message_expression: Option<Program>,
    /// `fieldPath`, normalised (`provider`, `labels[a]`).
    field_path: Option<String>,
    /// `reason`.
    reason: Option<String>,
    /// `optionalOldSelf`.
    optional_old_self: bool,
    /// Whether the rule (or its message expression) mentions `oldSelf`.
    pub(crate) uses_old_self: bool,
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rule").field("source", &self.source).finish_non_exhaustive()
    }
}

impl Rule {
    /// What upstream calls the rule in error messages: the message, else the rule.
    fn error_string(&self) -> &str {
        self.message.as_deref().unwrap_or(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use cel::Context;
    use serde_json::{Value, json};

    use super::*;
    use crate::apiserver::crd::schema::{self, Node};

    fn compiled(s: &Value) -> Result<Node, Vec<String>> {
        let mut errs = Vec::new();
        let mut parsed = schema::parse(s, "s", &mut errs);
        compile_all(&mut parsed.root, "s", true, None, &mut errs);
        if errs.is_empty() {
            Ok(parsed.root)
        } else {
            Err(errs.iter().map(|e| format!("{}: {}", e.field, e.message)).collect())
        }
    }

    fn spec_with(rules: &Value) -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-validations": rules,
            "properties": {"a": {"type": "string"}, "n": {"type": "integer"},
                           "list": {"type": "array", "items": {"type": "string"}}}}}})
    }

    fn run(node: &Node, obj: &Value, old: Option<&Value>) -> Vec<String> {
        let (errs, warnings) = validate(node, obj, old);
        errs.iter()
            .map(|e| format!("{} {}: {}", e.reason, e.field, e.message))
            .chain(warnings.into_iter().map(|w| format!("warning {w}")))
            .collect()
    }

    #[test]
    fn compile_errors_name_the_rule() {
        let e = compiled(&spec_with(&json!([{"rule": "self.b == 1"}]))).unwrap_err();
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("s.properties[spec].x-kubernetes-validations[0].rule: Invalid value: {\"rule\":\"self.b == 1\"}: compilation failed: ERROR: <input>:1:5: undefined field 'b'"), "{e:?}");
        let e = compiled(&spec_with(&json!([{"rule": "self.a =="}]))).unwrap_err();
        assert!(e[0].contains("compilation failed"), "{e:?}");
        let e = compiled(&spec_with(&json!([{"rule": "nope(self.a)"}]))).unwrap_err();
        assert!(e[0].contains("undeclared reference to 'nope'"), "{e:?}");
        let e = compiled(&spec_with(&json!([{"rule": "self.a == x"}]))).unwrap_err();
        assert!(e[0].contains("undeclared reference to 'x'"), "{e:?}");
        let e =
            compiled(&spec_with(&json!([{"rule": "true", "optionalOldSelf": true}]))).unwrap_err();
        assert!(e[0].contains("optionalOldSelf: Invalid value: true: may not be set if oldSelf is not used in rule"), "{e:?}");
        let e = compiled(&json!({"type": "object", "properties": {"l": {"type": "array", "items": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}}}})).unwrap_err();
        assert!(e[0].contains("oldSelf cannot be used on the uncorrelatable portion of the schema within s.properties[l]"), "{e:?}");
        assert!(compiled(&spec_with(&json!([{"rule": "self.list.all(x, x.startsWith('a')) && ip.isCanonical('::1') && cidr('10.0.0.0/8').containsIP(ip('10.1.2.3'))"}]))).is_ok());
    }

    #[test]
    fn rules_evaluate_with_messages_and_paths() {
        let node = compiled(&spec_with(&json!([
            {"rule": "self.n < 10", "messageExpression": "'n is ' + string(self.n)", "fieldPath": ".n"},
            {"rule": "self.a == oldSelf.a", "message": "a is immutable", "reason": "FieldValueForbidden"},
            {"rule": "oldSelf.list.all(x, x in self.list)", "message": "list is append-only"},
            {"rule": "isCIDR(self.a) && cidr(self.a).containsIP(ip('10.0.0.1'))", "message": "a must hold 10.0.0.1"},
        ])))
        .unwrap();
        let obj = json!({"spec": {"a": "10.0.0.0/24", "n": 3, "list": ["x"]}});
        assert!(run(&node, &obj, None).is_empty());
        let bad = json!({"spec": {"a": "192.168.0.0/24", "n": 12, "list": []}});
        let got = run(&node, &bad, Some(&obj));
        assert_eq!(
            got,
            [
                "FieldValueInvalid spec.n: Invalid value: n is 12",
                "FieldValueForbidden spec: Forbidden: a is immutable",
                "FieldValueInvalid spec: Invalid value: list is append-only",
                "FieldValueInvalid spec: Invalid value: a must hold 10.0.0.1",
            ]
        );
        // On create the transition rules do not run.
        assert_eq!(run(&node, &bad, None).len(), 2);
    }

    #[test]
    fn runtime_errors_and_ratcheting() {
        let node = compiled(&json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "c": {"type": "string", "x-kubernetes-validations": [{"rule": "cidr(self).prefixLength() > 8", "message": "too big"}]}}}}}))
        .unwrap();
        let got = run(&node, &json!({"spec": {"c": "nope"}}), None);
        assert_eq!(got.len(), 1);
        assert!(
            got[0].starts_with("FieldValueInvalid spec.c: Invalid value: \"string\": "),
            "{got:?}"
        );
        assert!(got[0].ends_with("evaluating rule: too big"), "{got:?}");
        let old = json!({"spec": {"c": "10.0.0.0/8"}});
        let got = run(&node, &old, Some(&old));
        assert_eq!(got, ["warning spec.c: Invalid value: \"10.0.0.0/8\": too big"]);
    }

    fn eval(source: &str) -> Result<cel::Value, String> {
        let program = ENV.compile(source).map_err(|e| e.to_string())?;
        let context = Context::with_env(Arc::clone(&ENV));
        program.execute(&context).map_err(|e| e.to_string())
    }

    #[test]
    fn kubernetes_library_functions() {
        for expr in [
            "ip.isCanonical('2001:db8::abcd')",
            "!ip.isCanonical('2001:DB8::ABCD')",
            "!ip.isCanonical('2001:db8::0:0:0:abcd')",
            "ip('127.0.0.1').family() == 4 && ip('::1').family() == 6",
            "ip('0.0.0.0').isUnspecified() && ip('::1').isLoopback()",
            "ip('224.0.0.1').isLinkLocalMulticast() && ip('ff02::1').isLinkLocalMulticast()",
            "ip('169.254.169.254').isLinkLocalUnicast() && ip('fe80::1').isLinkLocalUnicast()",
            "ip('192.168.0.1').isGlobalUnicast() && !ip('255.255.255.255').isGlobalUnicast()",
            "isIP('10.0.0.1') && !isIP('10.0.0.256') && !isIP('::ffff:1.2.3.4')",
            "isCIDR('10.0.0.0/8') && !isCIDR('10.0.0.0/33') && !isCIDR('10.0.0.0')",
            "cidr('192.168.0.1/24').masked() == cidr('192.168.0.0/24')",
            "cidr('192.168.0.1/24') != cidr('192.168.0.1/24').masked()",
            "cidr('192.168.0.0/24').prefixLength() == 24",
            "cidr('192.168.0.1/24').ip() == ip('192.168.0.1')",
            "cidr('192.168.0.0/16').containsCIDR('192.168.10.0/24')",
            "!cidr('192.168.1.0/24').containsCIDR(cidr('192.168.2.0/24'))",
            "cidr('2001:db8::/32').containsIP('2001:db8::1') && !cidr('2001:db8::/32').containsIP(ip('2001:dc8::1'))",
            "string(cidr('10.0.0.0/8')) == '10.0.0.0/8' && string(ip('::1')) == '::1'",
            "[1, 2, 2, 3].isSorted() && ![2, 1].isSorted()",
            "[1, 2, 3].sum() == 6 && [1.5, 2.5].sum() == 4.0 && [].sum() == 0",
            "[3, 1, 2].min() == 1 && ['a', 'c', 'b'].max() == 'c'",
            "[1, 2, 1].indexOf(1) == 0 && [1, 2, 1].lastIndexOf(1) == 2 && [1].indexOf(5) == -1",
            "'abc'.indexOf('c') == 2 && 'a,b'.split(',').size() == 2",
        ] {
            assert_eq!(eval(expr), Ok(cel::Value::Bool(true)), "{expr}");
        }
        for expr in
            ["ip('10.0.0.256')", "cidr('10.0.0.0/33')", "ip.isCanonical('nope')", "[].min()"]
        {
            assert!(eval(expr).is_err(), "{expr} should fail");
        }
    }

    #[test]
    fn optional_old_self() {
        let node = compiled(&spec_with(&json!([
            {"rule": "!oldSelf.hasValue() || oldSelf.value().a == self.a", "optionalOldSelf": true, "message": "fixed"}
        ])))
        .unwrap();
        assert!(run(&node, &json!({"spec": {"a": "x"}}), None).is_empty());
        assert_eq!(
            run(&node, &json!({"spec": {"a": "y"}}), Some(&json!({"spec": {"a": "x"}}))).len(),
            1
        );
    }
}
