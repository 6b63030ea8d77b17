//! The kit's own unit tests (the RBAC evaluator, the DaemonSet's quantities): the crate's
//! `#[cfg(test)]` module, run once as `netclaim-testkit`'s tests.

mod rbac {
    use std::collections::BTreeSet;

    use serde_json::{Value, json};

    use crate::rbac::{Check, evaluate, grants};

    fn check(verb: &str, group: &str, resource: &str, sub: &str, ns: &str, name: &str) -> Check {
        Check {
            user: "system:serviceaccount:sys:sa".to_owned(),
            verb: verb.to_owned(),
            api_group: group.to_owned(),
            resource: resource.to_owned(),
            subresource: sub.to_owned(),
            namespace: ns.to_owned(),
            name: name.to_owned(),
        }
    }

    fn objects() -> Vec<Value> {
        let subjects = json!([{"kind": "ServiceAccount", "name": "sa", "namespace": "sys"}]);
        vec![
            json!({"kind": "ClusterRole", "metadata": {"name": "cr"}, "rules": [
                {"apiGroups": ["g"], "resources": ["things", "things/status"], "verbs": ["get", "patch"]},
                {"apiGroups": ["g"], "resources": ["things/driver"], "resourceNames": ["d"], "verbs": ["associated-node:patch"]},
            ]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "crb"},
                   "roleRef": {"kind": "ClusterRole", "name": "cr"}, "subjects": subjects}),
            json!({"kind": "Role", "metadata": {"name": "r", "namespace": "sys"}, "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            ]}),
            json!({"kind": "RoleBinding", "metadata": {"name": "rb", "namespace": "sys"},
                   "roleRef": {"kind": "Role", "name": "r"}, "subjects": subjects}),
        ]
    }

    #[test]
    fn subresources_resource_names_and_role_namespaces_are_honoured() {
        let grants = grants(&objects());
        assert_eq!(grants.len(), 6);
        let checks: BTreeSet<Check> = [
            check("get", "g", "things", "", "a", "x"),
            check("patch", "g", "things", "status", "a", "x"),
            check("associated-node:patch", "g", "things", "driver", "a", "d"),
            check("create", "coordination.k8s.io", "leases", "", "sys", ""),
        ]
        .into();
        let verdict = evaluate(&grants, &checks);
        assert!(verdict.denied.is_empty(), "{:?}", verdict.denied);
        let unused: Vec<String> = verdict.unused.iter().map(ToString::to_string).collect();
        assert_eq!(
            unused,
            [
                "ClusterRole/cr rule 0: patch g/things (for system:serviceaccount:sys:sa)",
                "ClusterRole/cr rule 0: get g/things/status (for system:serviceaccount:sys:sa)",
            ]
        );
        let denied: BTreeSet<Check> = [
            // Another driver's name, a subresource the rule does not name, the Role outside
            // its namespace, another group, another user.
            check("associated-node:patch", "g", "things", "driver", "a", "other"),
            check("get", "g", "things", "scale", "a", "x"),
            check("create", "coordination.k8s.io", "leases", "", "kube-system", ""),
            check("get", "h", "things", "", "a", "x"),
            Check {
                user: "system:serviceaccount:sys:other".to_owned(),
                ..check("get", "g", "things", "", "a", "x")
            },
        ]
        .into();
        assert_eq!(evaluate(&grants, &denied).denied, denied);
    }
}

mod daemonset {
    #[test]
    fn quantities() {
        assert_eq!(crate::daemonset::quantity("50m", 1000), 50);
        assert_eq!(crate::daemonset::quantity("2", 1000), 2000);
        assert_eq!(crate::daemonset::quantity("256Mi", 1), 256 << 20);
        assert_eq!(crate::daemonset::quantity("1G", 1), 1_000_000_000);
    }
}
