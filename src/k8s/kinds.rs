//! The `kube::Resource` glue of our custom kinds (`PodNetwork`, `IPBlock`), so the typed
//! `kube::Api` serves them like the built-in kinds. The data types stay in `model`, which
//! knows nothing of the client.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::ClusterResourceScope;

use crate::model::pod_network::{GROUP, IpBlock, PodNetwork, VERSION};

impl kube::Resource for PodNetwork {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind((): &()) -> Cow<'_, str> {
        Cow::Borrowed("PodNetwork")
    }

    fn group((): &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }

    fn version((): &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSION)
    }

    fn plural((): &()) -> Cow<'_, str> {
        Cow::Borrowed("podnetworks")
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl kube::Resource for IpBlock {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind((): &()) -> Cow<'_, str> {
        Cow::Borrowed("IPBlock")
    }

    fn group((): &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }

    fn version((): &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSION)
    }

    fn plural((): &()) -> Cow<'_, str> {
        Cow::Borrowed("ipblocks")
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
