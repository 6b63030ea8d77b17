//! TokenReview (`authentication.k8s.io/v1`) and SubjectAccessReview
//! (`authorization.k8s.io/v1`) for the metrics endpoint's secure mode: the API server says
//! who a scraper's token is and whether that user may `get` a non-resource URL. Needs
//! `create` on both (the rights of `system:auth-delegator`).

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

use crate::metrics::access::{AccessReviewer, ReviewError, UserInfo};

/// The reviews through a kube client.
#[derive(Clone)]
pub struct KubeAccessReview {
    client: kube::Client,
}

impl std::fmt::Debug for KubeAccessReview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeAccessReview").finish_non_exhaustive()
    }
}

impl KubeAccessReview {
    /// Reviews through `client` (the process's own identity).
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl AccessReviewer for KubeAccessReview {
    async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        let review = TokenReview {
            // No audiences: the API server's own, those of a service-account token, as
            // controller-runtime's filter and kube-rbac-proxy (by default) ask.
            spec: TokenReviewSpec { token: token.to_owned(), audiences: None },
            ..TokenReview::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|err| ReviewError { what: "TokenReview", message: err.to_string() })?;
        let Some(status) = answer.status.filter(|s| s.authenticated == Some(true)) else {
            return Ok(None);
        };
        let user = status.user.unwrap_or_default();
        Ok(Some(UserInfo {
            name: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
        }))
    }

    async fn authorize(
        &self,
        user: &UserInfo,
        verb: &str,
        path: &str,
    ) -> Result<bool, ReviewError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: Some(user.uid.clone()).filter(|uid| !uid.is_empty()),
                groups: Some(user.groups.clone()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some(verb.to_owned()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|err| ReviewError { what: "SubjectAccessReview", message: err.to_string() })?;
        Ok(answer.status.is_some_and(|status| status.allowed))
    }
}
