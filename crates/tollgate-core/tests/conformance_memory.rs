//! The conformance suite (tollgate-testkit) against `MemoryStore`.

use tollgate_core::MemoryStore;

tollgate_testkit::conformance_tests!(|clock| async move { MemoryStore::new(clock) });

/// The same suite through `run_all`, in one store per scenario.
#[tokio::test]
async fn run_all_passes() {
    tollgate_testkit::run_all(|clock| async move { MemoryStore::new(clock) }).await;
}
