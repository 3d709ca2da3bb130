//! Optional linkage from machines to the Kubernetes nodes they became. A machine with
//! no node is a valid machine; the core never needs this.

use std::collections::HashMap;

use crate::machine::{Machine, NodeRef};

/// Fills [`Machine::node`] of every machine whose provider ID a node reports, and
/// clears it on machines no node reports any more. `nodes` are `(node name, the node's
/// spec.providerID)` pairs, as a controller lists them from the API server; the kubelet
/// was given the machine's provider ID (`--provider-id`), so the two match exactly.
/// Returns how many machines are linked.
pub fn link_nodes<'a>(
    machines: &mut [Machine],
    nodes: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> usize {
    let by_provider_id: HashMap<&str, &str> = nodes.into_iter().map(|(n, p)| (p, n)).collect();
    let mut linked = 0;
    for m in machines {
        m.node = by_provider_id
            .get(m.provider_id.as_str())
            .map(|name| NodeRef {
                name: (*name).to_owned(),
            });
        linked += usize::from(m.node.is_some());
    }
    linked
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MachineName, Phase, ProviderId};

    fn machine(name: &str, id: &str) -> Machine {
        Machine::new(
            MachineName::new(name).unwrap(),
            ProviderId::new(id).unwrap(),
            Phase::Ready,
        )
    }

    #[test]
    fn machines_are_linked_by_provider_id_and_unlinked_when_their_node_goes() {
        let mut machines = vec![
            machine("a", "aws:///us-east-1a/i-0a"),
            machine("b", "aws:///us-east-1a/i-0b"),
        ];
        let n = link_nodes(
            &mut machines,
            [
                ("node-a", "aws:///us-east-1a/i-0a"),
                ("node-x", "aws:///x/i-9"),
            ],
        );
        assert_eq!(n, 1);
        assert_eq!(machines[0].node.as_ref().unwrap().name, "node-a");
        assert!(
            machines[1].node.is_none(),
            "a machine with no node stays valid"
        );
        assert_eq!(link_nodes(&mut machines, []), 0);
        assert!(machines[0].node.is_none());
    }
}
