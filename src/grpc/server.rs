//! The CloudProvider service: each call reads the request, asks the provider core on behalf of
//! cluster-autoscaler, and writes the answer. No decision is taken here.

use tonic::{Request, Response, Status};

use crate::provider::{Caller, GroupOptions, Provider};

use super::convert;
use super::proto;
use super::proto::cloud_provider_server::{CloudProvider, CloudProviderServer};
use super::status::to_status;

/// The externalgrpc service over a [`Provider`], acting for cluster-autoscaler.
#[derive(Clone)]
pub struct CloudProviderService {
    provider: Provider,
    caller: Caller,
}

impl CloudProviderService {
    pub fn new(provider: Provider) -> Self {
        Self { provider, caller: Caller::cluster_autoscaler() }
    }

    /// The tonic service to add to a server, with explicit message size limits.
    pub fn into_server(self) -> CloudProviderServer<Self> {
        CloudProviderServer::new(self)
            .max_decoding_message_size(MAX_REQUEST_BYTES)
            .max_encoding_message_size(MAX_RESPONSE_BYTES)
    }
}

/// The largest request read. cluster-autoscaler's requests name a group or a few nodes (a
/// DeleteNodes of a whole pool is a few KiB); the largest, a PricingPodPrice, carries one Pod,
/// which etcd caps at 1.5 MiB. A larger request is refused before it is decoded.
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
/// The largest answer written: a NodeGroupNodes of a big pool or a template node stays far
/// below it; past it something is wrong and the call fails rather than flooding the client.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

type Answer<T> = Result<Response<T>, Status>;

/// One line per call that changes a pool, in the form a person reads cluster-autoscaler's
/// intent in (`IncreaseSize(workers, +3)`); the reads, which come every loop, are not logged.
fn log_call(call: std::fmt::Arguments<'_>) {
    tracing::info!("cluster-autoscaler called {call}");
}

#[tonic::async_trait]
impl CloudProvider for CloudProviderService {
    #[tracing::instrument(skip_all, fields(rpc = "NodeGroups"))]
    async fn node_groups(
        &self,
        _: Request<proto::NodeGroupsRequest>,
    ) -> Answer<proto::NodeGroupsResponse> {
        let groups = self.provider.node_groups(&self.caller).map_err(to_status)?;
        Ok(Response::new(proto::NodeGroupsResponse {
            node_groups: groups.into_iter().map(convert::node_group).collect(),
        }))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeGroupForNode"))]
    async fn node_group_for_node(
        &self,
        request: Request<proto::NodeGroupForNodeRequest>,
    ) -> Answer<proto::NodeGroupForNodeResponse> {
        let node = convert::node_ref(request.get_ref().node.as_ref());
        let group = self.provider.node_group_for_node(&self.caller, &node).map_err(to_status)?;
        // An unmanaged node gets a group with an empty id, never an error.
        let node_group = group.map(convert::node_group).unwrap_or_default();
        Ok(Response::new(proto::NodeGroupForNodeResponse { node_group: Some(node_group) }))
    }

    #[tracing::instrument(skip_all, fields(rpc = "PricingNodePrice"))]
    async fn pricing_node_price(
        &self,
        request: Request<proto::PricingNodePriceRequest>,
    ) -> Answer<proto::PricingNodePriceResponse> {
        let r = request.get_ref();
        let window = convert::window(
            (r.start_timestamp.as_ref(), r.end_timestamp.as_ref()),
            (r.start_time.as_ref(), r.end_time.as_ref()),
        )?;
        let node = convert::node_ref(r.node.as_ref());
        let price = self.provider.node_price(&self.caller, &node, window).map_err(to_status)?;
        Ok(Response::new(proto::PricingNodePriceResponse { price }))
    }

    #[tracing::instrument(skip_all, fields(rpc = "PricingPodPrice"))]
    async fn pricing_pod_price(
        &self,
        request: Request<proto::PricingPodPriceRequest>,
    ) -> Answer<proto::PricingPodPriceResponse> {
        let r = request.get_ref();
        let window = convert::window(
            (r.start_timestamp.as_ref(), r.end_timestamp.as_ref()),
            (r.start_time.as_ref(), r.end_time.as_ref()),
        )?;
        let pod = convert::pod_placement(&r.pod_bytes, &r.pod)?;
        let price = self.provider.pod_price(&self.caller, &pod, window).map_err(to_status)?;
        Ok(Response::new(proto::PricingPodPriceResponse { price }))
    }

    #[tracing::instrument(skip_all, fields(rpc = "GPULabel"))]
    async fn gpu_label(
        &self,
        _: Request<proto::GpuLabelRequest>,
    ) -> Answer<proto::GpuLabelResponse> {
        Ok(Response::new(proto::GpuLabelResponse { label: self.provider.gpu_label().to_owned() }))
    }

    #[tracing::instrument(skip_all, fields(rpc = "GetAvailableGPUTypes"))]
    async fn get_available_gpu_types(
        &self,
        _: Request<proto::GetAvailableGpuTypesRequest>,
    ) -> Answer<proto::GetAvailableGpuTypesResponse> {
        // cluster-autoscaler reads only the keys.
        let gpu_types = self
            .provider
            .gpu_types()
            .iter()
            .map(|t| (t.clone(), prost_types::Any::default()))
            .collect();
        Ok(Response::new(proto::GetAvailableGpuTypesResponse { gpu_types }))
    }

    #[tracing::instrument(skip_all, fields(rpc = "Cleanup"))]
    async fn cleanup(&self, _: Request<proto::CleanupRequest>) -> Answer<proto::CleanupResponse> {
        Ok(Response::new(proto::CleanupResponse {}))
    }

    #[tracing::instrument(skip_all, fields(rpc = "Refresh"))]
    async fn refresh(&self, _: Request<proto::RefreshRequest>) -> Answer<proto::RefreshResponse> {
        self.provider.refresh();
        Ok(Response::new(proto::RefreshResponse {}))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeGroupTargetSize", group = %request.get_ref().id))]
    async fn node_group_target_size(
        &self,
        request: Request<proto::NodeGroupTargetSizeRequest>,
    ) -> Answer<proto::NodeGroupTargetSizeResponse> {
        let target_size =
            self.provider.target_size(&self.caller, &request.get_ref().id).map_err(to_status)?;
        Ok(Response::new(proto::NodeGroupTargetSizeResponse { target_size }))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeGroupIncreaseSize", group = %request.get_ref().id, delta = request.get_ref().delta))]
    async fn node_group_increase_size(
        &self,
        request: Request<proto::NodeGroupIncreaseSizeRequest>,
    ) -> Answer<proto::NodeGroupIncreaseSizeResponse> {
        // The connection tells one cluster-autoscaler process from the next (adoption.rs).
        let caller = self.caller.over(request.remote_addr());
        let r = request.get_ref();
        log_call(format_args!("IncreaseSize({}, {:+})", r.id, r.delta));
        self.provider.increase_size(&caller, &r.id, r.delta).await.map_err(to_status)?;
        Ok(Response::new(proto::NodeGroupIncreaseSizeResponse {}))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeGroupDeleteNodes", group = %request.get_ref().id, nodes = request.get_ref().nodes.len()))]
    async fn node_group_delete_nodes(
        &self,
        request: Request<proto::NodeGroupDeleteNodesRequest>,
    ) -> Answer<proto::NodeGroupDeleteNodesResponse> {
        let r = request.get_ref();
        let nodes: Vec<_> = r.nodes.iter().map(|n| convert::node_ref(Some(n))).collect();
        let names: Vec<&str> = r.nodes.iter().map(|n| n.name.as_str()).collect();
        log_call(format_args!("DeleteNodes({}, [{}])", r.id, names.join(", ")));
        self.provider.delete_nodes(&self.caller, &r.id, &nodes).await.map_err(to_status)?;
        Ok(Response::new(proto::NodeGroupDeleteNodesResponse {}))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeGroupDecreaseTargetSize", group = %request.get_ref().id, delta = request.get_ref().delta))]
    async fn node_group_decrease_target_size(
        &self,
        request: Request<proto::NodeGroupDecreaseTargetSizeRequest>,
    ) -> Answer<proto::NodeGroupDecreaseTargetSizeResponse> {
        let r = request.get_ref();
        log_call(format_args!("DecreaseTargetSize({}, {})", r.id, r.delta));
        self.provider
            .decrease_target_size(&self.caller, &r.id, r.delta)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::NodeGroupDecreaseTargetSizeResponse {}))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeGroupNodes", group = %request.get_ref().id))]
    async fn node_group_nodes(
        &self,
        request: Request<proto::NodeGroupNodesRequest>,
    ) -> Answer<proto::NodeGroupNodesResponse> {
        let instances =
            self.provider.instances(&self.caller, &request.get_ref().id).map_err(to_status)?;
        Ok(Response::new(proto::NodeGroupNodesResponse {
            instances: instances.into_iter().map(convert::instance).collect(),
        }))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeGroupTemplateNodeInfo", group = %request.get_ref().id))]
    async fn node_group_template_node_info(
        &self,
        request: Request<proto::NodeGroupTemplateNodeInfoRequest>,
    ) -> Answer<proto::NodeGroupTemplateNodeInfoResponse> {
        use prost::Message;
        let node =
            self.provider.template_node(&self.caller, &request.get_ref().id).map_err(to_status)?;
        let bytes = node.encode_to_vec();
        // The same bytes serve both generations of the client: an embedded Node message and a
        // bytes field share a wire type.
        Ok(Response::new(proto::NodeGroupTemplateNodeInfoResponse {
            node_info: bytes.clone(),
            node_bytes: bytes,
        }))
    }

    #[tracing::instrument(skip_all, fields(rpc = "NodeGroupGetOptions", group = %request.get_ref().id))]
    async fn node_group_get_options(
        &self,
        request: Request<proto::NodeGroupAutoscalingOptionsRequest>,
    ) -> Answer<proto::NodeGroupAutoscalingOptionsResponse> {
        let r = request.get_ref();
        let defaults = convert::defaults(r.defaults.as_ref());
        match self.provider.options(&self.caller, &r.id, &defaults).map_err(to_status)? {
            // The one code cluster-autoscaler reads as "use your own defaults". Asked every
            // loop, so it is not logged above debug.
            GroupOptions::FlagsApply => {
                tracing::debug!("the group overrides no option");
                Err(Status::unimplemented(format!(
                    "group {:?} overrides no autoscaling option: cluster-autoscaler's own flags \
                     apply to it",
                    r.id
                )))
            }
            GroupOptions::Overridden { options, .. } => {
                Ok(Response::new(proto::NodeGroupAutoscalingOptionsResponse {
                    node_group_autoscaling_options: Some(convert::options(options)),
                }))
            }
        }
    }
}
