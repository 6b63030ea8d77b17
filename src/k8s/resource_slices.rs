//! ResourceSlices of one node and driver through the API server: list, server-side apply
//! (field manager = driver name), delete, and a watch for repairs.

use futures::{Stream, StreamExt};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;

use crate::model::cause::cause;
use kube::{Api, Client};

use crate::inventory::publish::{SliceApi, SliceApiError, SliceEvent};

/// The slices of `node` published by `driver`.
#[derive(Clone)]
pub struct KubeSlices {
    api: Api<ResourceSlice>,
    watch_api: Api<ResourceSlice>,
    driver: String,
    field_selector: String,
}

impl KubeSlices {
    /// Slices of `node` and `driver`: `client` for unary calls, `watch_client` for the watch.
    #[must_use]
    pub fn new(client: Client, watch_client: Client, driver: &str, node: &str) -> Self {
        Self {
            api: Api::all(client),
            watch_api: Api::all(watch_client),
            driver: driver.to_owned(),
            // ResourceSlices support these field selectors server-side (resource.k8s.io/v1).
            field_selector: format!("spec.nodeName={node},spec.driver={driver}"),
        }
    }

    /// Watch events of these slices, as the publisher needs them.
    pub fn watch(&self) -> impl Stream<Item = SliceEvent> + Send + 'static {
        let config = watcher::Config::default().fields(&self.field_selector);
        watcher(self.watch_api.clone(), config).map(|event| match event {
            Ok(watcher::Event::Apply(slice) | watcher::Event::InitApply(slice)) => {
                SliceEvent::Present(Box::new(slice))
            }
            Ok(watcher::Event::Delete(slice)) => {
                SliceEvent::Deleted(slice.metadata.name.unwrap_or_default())
            }
            Ok(watcher::Event::Init) => SliceEvent::Relisting,
            Ok(watcher::Event::InitDone) => SliceEvent::Relisted,
            Err(err) => SliceEvent::Error(cause(err)),
        })
    }
}

fn api_error(operation: &'static str, name: &str, err: &kube::Error) -> SliceApiError {
    let code = match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    };
    SliceApiError { operation, name: name.to_owned(), code, message: err.to_string() }
}

impl SliceApi for KubeSlices {
    async fn list(&self) -> Result<Vec<ResourceSlice>, SliceApiError> {
        let params = ListParams::default().fields(&self.field_selector);
        self.api
            .list(&params)
            .await
            .map(|list| list.items)
            .map_err(|err| api_error("list", "", &err))
    }

    async fn apply(&self, slice: &ResourceSlice) -> Result<ResourceSlice, SliceApiError> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        // force: we are the only writer of our node's slices; take over fields another
        // manager (an admin's kubectl edit) touched rather than failing on a conflict.
        let params = PatchParams::apply(&self.driver).force();
        self.api
            .patch(&name, &params, &Patch::Apply(slice))
            .await
            .map_err(|err| api_error("apply", &name, &err))
    }

    async fn delete(&self, name: &str) -> Result<(), SliceApiError> {
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(err) => Err(api_error("delete", name, &err)),
        }
    }
}
