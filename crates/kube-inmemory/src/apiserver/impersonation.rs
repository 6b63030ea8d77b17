//! User impersonation (`kubectl --as`, `--as-group`, `--as-uid`, and a kubeconfig user's
//! `as-user-extra`): the `Impersonate-User`, `Impersonate-Group`, `Impersonate-Uid` and
//! `Impersonate-Extra-<key>` headers replace the caller's identity, as kube-apiserver's
//! impersonation filter does. kubectl sends no bearer token over plain HTTP, so this is how a
//! user of the dev server acts as another identity, a node's ServiceAccount with its node
//! (`authentication.kubernetes.io/node-name`) to try the admission policies, say.
//!
//! Who may impersonate: the real server asks RBAC (`impersonate` on users, groups, uids,
//! userextras); here only `system:masters` (the admin) may, everyone else is refused.

use std::collections::BTreeMap;

use axum::http::HeaderMap;

use super::error::ApiError;
use super::reviews::UserInfo;

const USER: &str = "impersonate-user";
const GROUP: &str = "impersonate-group";
const UID: &str = "impersonate-uid";
const EXTRA: &str = "impersonate-extra-";

/// `%XX` escapes decoded (header names carry extra keys such as
/// `authentication.kubernetes.io%2fnode-name`); a malformed escape is kept as written.
fn unescape(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The identity `caller` acts as: itself without impersonation headers, else the one they
/// name (the groups and extra a real server adds included).
pub(crate) fn apply(caller: UserInfo, headers: &HeaderMap) -> Result<UserInfo, ApiError> {
    let values = |name: &str| -> Vec<String> {
        headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).map(str::to_owned).collect()
    };
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        if let (Some(key), Ok(value)) = (name.as_str().strip_prefix(EXTRA), value.to_str()) {
            extra.entry(unescape(key)).or_default().push(value.to_owned());
        }
    }
    let groups = values(GROUP);
    let uid = values(UID).into_iter().next();
    let Some(user) = values(USER).into_iter().next() else {
        if groups.is_empty() && extra.is_empty() && uid.is_none() {
            return Ok(caller);
        }
        return Err(ApiError::bad_request(
            "requested impersonation of groups, uid or extra without impersonating a user",
        ));
    };
    if !caller.groups.iter().any(|g| g == "system:masters") {
        return Err(ApiError::with(
            403,
            "Forbidden",
            format!(
                "users \"{user}\" is forbidden: User \"{}\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope (netclaim dev lets only system:masters impersonate)",
                caller.name
            ),
        ));
    }
    let mut all_groups = groups;
    if let Some((namespace, _)) =
        user.strip_prefix("system:serviceaccount:").and_then(|rest| rest.split_once(':'))
    {
        for group in
            ["system:serviceaccounts".to_owned(), format!("system:serviceaccounts:{namespace}")]
        {
            if !all_groups.contains(&group) {
                all_groups.push(group);
            }
        }
    }
    let authenticated = "system:authenticated".to_owned();
    if user != super::request_log::ANONYMOUS_USER && !all_groups.contains(&authenticated) {
        all_groups.push(authenticated);
    }
    Ok(UserInfo::impersonated(user, uid.unwrap_or_default(), all_groups, extra))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn headers_name_the_user_its_groups_and_extra() {
        let mut headers = HeaderMap::new();
        let user = "system:serviceaccount:netns:agent";
        headers.insert(USER, HeaderValue::from_static(user));
        headers.insert(
            "impersonate-extra-authentication.kubernetes.io%2fnode-name",
            HeaderValue::from_static("n1"),
        );
        let admin = super::super::reviews::admin();
        let as_agent = apply(admin.clone(), &headers).unwrap();
        assert_eq!(as_agent.name, user);
        assert_eq!(
            as_agent.groups,
            ["system:serviceaccounts", "system:serviceaccounts:netns", "system:authenticated"]
        );
        assert_eq!(as_agent.extra["authentication.kubernetes.io/node-name"], ["n1"]);
        assert_eq!(apply(admin.clone(), &HeaderMap::new()).unwrap(), admin);
        let err = apply(as_agent, &headers).unwrap_err();
        assert_eq!(err.code, 403, "only the admin impersonates");
    }
}
