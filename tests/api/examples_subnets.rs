//! The shipped examples (`examples/`, `deploy/examples/`) run side by side: no two of them
//! hand addresses from overlapping subnets. Two macvlan pods on one parent with the same
//! subnet and different gateways (as `examples/dev/macvlan-pod.yaml` and
//! `deploy/examples/macvlan-pod.yaml` once were) collide: the second pod's routes fail, or two
//! pods get one address. tests/netns/examples_dev.rs runs them all in one `netclaim dev`.

use crate::kit::examples;

#[test]
fn no_two_examples_share_a_subnet() {
    let files = examples::files();
    let named: Vec<_> = files.iter().map(|f| (f, examples::subnets(f))).collect();
    let with_addresses = named.iter().filter(|(_, subnets)| !subnets.is_empty()).count();
    // The dev macvlan pod, the deploy macvlan pod, the host-device claim and the PodNetwork.
    assert!(with_addresses >= 4, "examples with addresses: {named:?}");
    for (i, (file, subnets)) in named.iter().enumerate() {
        for (other, other_subnets) in &named[i + 1..] {
            for a in subnets {
                for b in other_subnets {
                    assert!(
                        !examples::overlap(*a, *b),
                        "{} ({a}) and {} ({b}) overlap: give each example a subnet of its own",
                        file.display(),
                        other.display()
                    );
                }
            }
        }
    }
}
