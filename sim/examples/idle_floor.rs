//! The floor turmoil 0.7 sets under a long, quiet run: what a step costs
//! when no host has anything to do.
//!
//! turmoil steps every host's runtime (and the network's own) once per
//! tick, whether or not a timer is due, and its `Sim` offers no way to skip
//! or coarsen idle ticks (only `step` and `run`, at one tick fixed when it
//! is built). A simulated day at the default 10 ms tick is 8.64 million
//! steps however little happens in it. This example times the same
//! builder the simulator uses ([`sim_builder`]) with one idle server host
//! listening and one client host asleep, so the per-step floor can be read
//! beside a real run of the same length:
//!
//! ```text
//! cargo run --release -p redstring-sim --example idle_floor -- 86400
//! ```

use std::time::{Duration, Instant};

use redstring_sim::scenario::Network;
use redstring_sim::world::sim_builder;

fn main() {
    let simulated_s: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("the simulated seconds, a whole number"))
        .unwrap_or(3600);
    let tick = Duration::from_millis(10);
    let run = Duration::from_secs(simulated_s);
    let mut sim = sim_builder(1, tick, &Network::default(), run + Duration::from_secs(1)).build();
    sim.host("server", || async {
        let _listener = turmoil::net::TcpListener::bind(("0.0.0.0", 80)).await?;
        std::future::pending::<()>().await;
        Ok(())
    });
    sim.client("worker", async move {
        tokio::time::sleep(run).await;
        Ok(())
    });
    let started = Instant::now();
    sim.run().expect("an idle simulation runs to its end");
    let wall = started.elapsed();
    let steps = run.as_nanos() / tick.as_nanos();
    println!(
        "{simulated_s} s simulated in {:.2} s of wall time: {steps} steps of {} ms over 2 hosts, {:.2} µs a step",
        wall.as_secs_f64(),
        tick.as_millis(),
        wall.as_secs_f64() * 1e6 / steps as f64,
    );
}
