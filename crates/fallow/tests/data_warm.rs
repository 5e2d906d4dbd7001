//! Data in ahead of a job: `fallow dataset warm` asks the nodes a job of a given shape would
//! most likely get to stage a dataset; `fallow dev`'s agent fetches it from a real HTTP server
//! in the test, `job quote` then counts the node as holding it, and a job naming the dataset
//! finds it there without fetching it again.

mod common;

use std::time::{Duration, Instant};

use common::bucket::Bucket;
use common::dev::{WITHIN, fallow, json};
use common::succeeded;

#[test]
fn a_warmed_dataset_is_staged_on_the_likeliest_node_and_a_job_finds_it_there() {
    let started = common::dev::start_ready("fallow-data-warm");
    let (mut dev, url, key) = (started.dev, started.url, started.tenant_key.as_str());
    let bucket = Bucket::start();
    let bytes: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let hex = blake3::hash(&bytes).to_hex().to_string();
    let dataset = format!("{},blake3:{hex},{}", bucket.url("/data/corpus.bin"), bytes.len());
    bucket.put("/data/corpus.bin", bytes);
    let shape = ["--gpus", "1", "--tier", "silver", "--max-price", "5"];

    let mut warm = vec!["dataset", "warm", dataset.as_str(), "--nodes", "1"];
    warm.extend_from_slice(&shape);
    let said = succeeded(&fallow(&url, key, &warm), "dataset warm");
    assert!(said.contains("on 1 node(s) (1): 0 hold it already"), "{said}");

    // The node's agent fetches it in the background; the quote counts the node once it says so.
    let mut quote = vec!["job", "quote", "--json", "--dataset", dataset.as_str()];
    quote.extend_from_slice(&shape);
    let start = Instant::now();
    loop {
        let answer = json(fallow(&url, key, &quote), "job quote");
        if answer["nodes_with_data"] == 1 {
            break;
        }
        assert!(start.elapsed() < WITHIN, "never staged: {answer}\n{}", dev.log());
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(bucket.gets(), 1, "fetched once");
    let said = succeeded(&fallow(&url, key, &warm), "dataset warm again");
    assert!(said.contains("1 hold it already"), "{said}");

    // A job naming it finds it in $FALLOW_DATASETS_DIR, with no second fetch.
    let mut submit = vec!["job", "submit", "--wait", "--dataset", dataset.as_str()];
    submit.extend_from_slice(&shape);
    let script = format!("wc -c < \"$FALLOW_DATASETS_DIR/blake3-{hex}\"");
    submit.extend_from_slice(&["--process", "--", "sh", "-c", script.as_str()]);
    let said = succeeded(&fallow(&url, key, &submit), "job submit --wait");
    assert!(said.contains("3000000"), "{said}");
    assert_eq!(bucket.gets(), 1, "the job's staging found it warm");

    let status = dev.stop_with("-TERM");
    assert!(status.success(), "exit status {status}:\n{}", dev.log());
}
