//! Snapshot tests of explanations: the words a tenant reads when a job cannot run.

mod common;

use common::*;
use model::{GpuCatalog, Tier, TopologyLevel};

fn market() -> matcher::Matcher {
    let mut specs = Vec::new();
    for index in 0..40 {
        let region = ["eu-west", "us-east", "ap-south"][index % 3];
        let model = ["H100", "A100", "L40", "RTX-4090"][index % 4];
        let ask = ["1.20", "1.90", "2.40", "3.10", "0.40"][index % 5];
        specs.push(node(region, model, 8, ask, 0.9).fabric((index % 2) as u32));
    }
    matcher(specs)
}

#[test]
fn explains_a_job_nobody_can_take() {
    let m = market();
    let mut spec = job(1, Tier::Silver, whole(2), "2.10");
    spec.regions = vec![region(&m, "eu-west")];
    spec.resources.gpu_models = vec![GpuCatalog::embedded().find("H100").unwrap()];
    insta::assert_snapshot!(m.explain(&spec, NOW).message);
}

#[test]
fn explains_a_gang_no_domain_can_hold() {
    let m = market();
    let spec = gang(2, Tier::Gold, 30, 8, TopologyLevel::Fabric);
    insta::assert_snapshot!(m.explain(&spec, NOW).message);
}

#[test]
fn explains_reliability_and_memory_floors() {
    let m = market();
    let mut spec = job(3, Tier::Bronze, whole(1), "9");
    spec.resources.gpu_memory_mib_min = 48 * 1024;
    spec.reliability_min_ppm = 950_000;
    insta::assert_snapshot!(m.explain(&spec, NOW).message);
}
