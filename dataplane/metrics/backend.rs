//! A kernel backend that counts the operations it passes on, by object
//! kind, operation and result; everything else goes straight through.

use std::net::IpAddr;
use std::sync::Arc;

use super::Metrics;
use crate::desired::ParentInterface;
use crate::kernel::firewall::{FirewallChanges, FirewallError, ForwardOp, TableOp};
use crate::kernel::objects::{DumpSink, IpsetChange, KernelOp, Link, Ownership};
use crate::kernel::watch::Watch;
use crate::kernel::{KernelBackend, KernelError};

pub struct MeteredBackend<B> {
    inner: B,
    metrics: Arc<Metrics>,
}

impl<B: KernelBackend> MeteredBackend<B> {
    pub fn new(inner: B, metrics: Arc<Metrics>) -> MeteredBackend<B> {
        MeteredBackend { inner, metrics }
    }
}

/// The object kind and operation, as the metric labels say them.
fn labels(op: &KernelOp) -> (&'static str, &'static str) {
    match op {
        KernelOp::CreateVxlan(_) => ("device", "create"),
        KernelOp::DeleteLink { .. } => ("device", "delete"),
        KernelOp::SetMtu { .. } => ("device", "set_mtu"),
        KernelOp::SetUp { .. } => ("device", "set_up"),
        KernelOp::DisableTxChecksum { .. } => ("device", "disable_tx_checksum"),
        KernelOp::AddAddress { .. } => ("address", "add"),
        KernelOp::DeleteAddress { .. } => ("address", "delete"),
        KernelOp::AddNexthop(_) => ("nexthop", "add"),
        KernelOp::ReplaceNexthop(_) => ("nexthop", "replace"),
        KernelOp::DeleteNexthop(_) => ("nexthop", "delete"),
        KernelOp::AddRoute(_) => ("route", "add"),
        KernelOp::ReplaceRoute(_) => ("route", "replace"),
        KernelOp::DeleteRoute(_) => ("route", "delete"),
        KernelOp::ReplaceNeighbor(_) => ("neighbor", "replace"),
        KernelOp::DeleteNeighbor(_) => ("neighbor", "delete"),
        KernelOp::ReplaceFdb(_) => ("fdb", "replace"),
        KernelOp::DeleteFdb(_) => ("fdb", "delete"),
        KernelOp::Ipset {
            change: IpsetChange::Update { .. },
            ..
        } => ("ipset", "update"),
        KernelOp::Ipset {
            change: IpsetChange::Replace { .. },
            ..
        } => ("ipset", "replace"),
    }
}

/// A firewall change's object kind and operation.
fn table_labels(op: &TableOp) -> (&'static str, &'static str) {
    match op {
        TableOp::Create(_) => ("nft_table", "create"),
        TableOp::AddElements(..) => ("nft_set", "add_elements"),
        TableOp::DeleteElements(..) => ("nft_set", "delete_elements"),
        TableOp::AddMasquerade(_) => ("nft_rule", "add"),
        TableOp::DeleteMasquerade { .. } => ("nft_rule", "delete"),
    }
}

fn forward_labels(op: &ForwardOp) -> (&'static str, &'static str) {
    match op {
        ForwardOp::Write { .. } => ("iptables_chain", "write"),
        ForwardOp::Remove { .. } => ("iptables_chain", "remove"),
    }
}

impl<B: KernelBackend> KernelBackend for MeteredBackend<B> {
    type Firewall = B::Firewall;

    fn firewall(&mut self) -> &mut B::Firewall {
        self.inner.firewall()
    }

    /// One apply is one transaction: each of its operations counts with
    /// the transaction's result.
    async fn apply_firewall(&mut self, changes: &FirewallChanges) -> Result<(), FirewallError> {
        let result = self.inner.apply_firewall(changes).await;
        let labels = changes.table.iter().map(table_labels);
        let labels = labels.chain(changes.forward.iter().map(|c| forward_labels(&c.op)));
        for (kind, name) in labels {
            self.metrics
                .kernel_operations(kind, name, result.is_ok(), 1);
        }
        result
    }

    async fn dump_into(
        &mut self,
        ownership: &Ownership,
        sink: &mut dyn DumpSink,
    ) -> Result<(), KernelError> {
        self.inner.dump_into(ownership, sink).await
    }

    async fn addresses(&mut self) -> Result<Vec<(u32, IpAddr)>, KernelError> {
        self.inner.addresses().await
    }

    async fn links(&mut self, names: &[String]) -> Result<Vec<Link>, KernelError> {
        self.inner.links(names).await
    }

    async fn find_interface(
        &mut self,
        address: IpAddr,
    ) -> Result<Option<ParentInterface>, KernelError> {
        self.inner.find_interface(address).await
    }

    async fn apply(&mut self, ops: &[KernelOp]) -> Vec<Result<(), KernelError>> {
        let results = self.inner.apply(ops).await;
        // Operations come grouped by kind: one metric update per run of
        // alike ones.
        let mut run: Option<((&'static str, &'static str, bool), u64)> = None;
        for (op, result) in ops.iter().zip(&results) {
            let (kind, name) = labels(op);
            let key = (kind, name, result.is_ok());
            match &mut run {
                Some((k, n)) if *k == key => *n += 1,
                _ => {
                    if let Some(((kind, name, ok), n)) = run.replace((key, 1)) {
                        self.metrics.kernel_operations(kind, name, ok, n);
                    }
                }
            }
        }
        if let Some(((kind, name, ok), n)) = run {
            self.metrics.kernel_operations(kind, name, ok, n);
        }
        results
    }

    async fn supports_nexthops(&mut self) -> bool {
        self.inner.supports_nexthops().await
    }

    fn watch(&mut self) -> Result<Watch, KernelError> {
        self.inner.watch()
    }
}
