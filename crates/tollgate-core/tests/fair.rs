//! Fair sharing beside today's static shares and no tenants (SPEC §5,
//! *Fair sharing*): the loads through the governor on a fake clock
//! and the memory store, each under the three configurations; prints the
//! table the closing note quotes (`--nocapture`), and checks where fair
//! sharing differs. (The same loads answer alike on Redis:
//! `tollgate-redis/tests/differential.rs::fair_loads_answer_as_memory`, and
//! the fair targets hold on a node and a cluster: the conformance
//! scenarios `fair_share_*`.)

use tollgate_core::{FakeClock, MemoryStore};
use tollgate_testkit::T0;
use tollgate_testkit::scenarios::fair::{Load, Offer, Sharing};

fn o(tenant: &'static str, weight: u32, every_ms: u64, from_ms: u64) -> Offer {
    Offer {
        tenant,
        weight,
        every_ms,
        from_ms,
    }
}

fn row(store: &str, load: &str, sharing: Sharing, l: &Load) -> String {
    let tenants: Vec<String> = l
        .tenants
        .iter()
        .map(|(t, g)| {
            format!(
                "{t} {:.1} % ({} served, {} refused, p99 {} ms)",
                100.0 * l.share(t),
                g.served,
                g.refused,
                g.p99()
            )
        })
        .collect();
    format!(
        "| {store} | {load} | {sharing:?} | {} | {} |",
        tenants.join("; "),
        l.densest_second
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_sharing_beside_static_shares_and_no_tenants() {
    let loads = [
        ("(a) alone", vec![o("a", 3, 10, 0)]),
        (
            "(b) 3:1 backlogged",
            vec![o("a", 3, 10, 0), o("b", 1, 10, 5)],
        ),
        (
            "(c) 1:1, light at half its share",
            vec![o("heavy", 1, 10, 0), o("light", 1, 400, 3)],
        ),
    ];
    let mut table = Vec::new();
    for (name, offers) in &loads {
        for sharing in [Sharing::Weights, Sharing::Shares, Sharing::None] {
            let clock = FakeClock::new(T0);
            let m = Load::run(
                MemoryStore::new(clock.clone()),
                &clock,
                offers,
                sharing,
                60_000,
            )
            .await;
            table.push(row("memory", name, sharing, &m));
            assert!(m.densest_second <= 70, "{name} {sharing:?}");
            if *name == "(c) 1:1, light at half its share" {
                let light = &m.tenants["light"];
                match sharing {
                    Sharing::Weights => {
                        assert_eq!(light.refused, 0);
                        assert!(light.p99() <= 200);
                    }
                    // Half each as ceilings: the light tenant is served,
                    // but what it leaves is wasted.
                    Sharing::Shares => {
                        let used: u64 = m.tenants.values().map(|g| g.served).sum();
                        assert!(used < 500, "{used}");
                    }
                    // No tenants: the heavy one books the pool up to
                    // max_wait ahead; the light one waits behind it or is
                    // refused.
                    Sharing::None => {
                        assert!(light.refused > 0 || light.p99() > 1_000, "{light:?}");
                    }
                }
            }
        }
    }
    eprintln!("| store | load | sharing | per tenant | most starts in 1 s |");
    eprintln!("|---|---|---|---|---|");
    for r in table {
        eprintln!("{r}");
    }
}
