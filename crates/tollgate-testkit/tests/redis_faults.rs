//! The fault helpers of `tollgate_testkit::redis` on real `redis-server`
//! processes: a durable server keeps what it acknowledged across a SIGKILL
//! and a restart on the same port; pause / resume, `DEBUG SLEEP` and
//! `CLIENT PAUSE` make it answer nothing for a while; a replicated cluster
//! fails a killed master's slots over to its replica and takes the old
//! master back as a replica.

// Waiting on real processes: real time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::time::{Duration, Instant};

use tollgate_testkit::redis::{RedisCluster, RedisServer, key_slot};

#[test]
fn a_durable_server_keeps_acknowledged_writes_across_kill_and_restart() {
    let mut s = RedisServer::start_durable().expect("redis-server");
    let (port, pid) = (s.port(), s.pid().expect("running"));
    for i in 0..100 {
        assert_eq!(
            s.command(&["SET", &format!("k{i}"), &i.to_string()])
                .unwrap(),
            "OK"
        );
    }
    s.kill();
    assert!(!s.is_up());
    assert_eq!(s.pid(), None);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "redis-server itself is gone (and reaped), not just its watchdog"
    );
    s.restart().expect("restart");
    assert_eq!(s.port(), port, "same port");
    assert_ne!(s.pid(), Some(pid));
    for i in [0, 57, 99] {
        assert_eq!(
            s.command(&["GET", &format!("k{i}")]).unwrap(),
            i.to_string()
        );
    }
    // A graceful stop keeps it too.
    s.stop();
    s.restart().expect("restart");
    assert_eq!(s.command(&["GET", "k99"]).unwrap(), "99");
}

#[test]
fn a_plain_server_restarts_empty() {
    let mut s = RedisServer::start().expect("redis-server");
    s.command(&["SET", "k", "v"]).unwrap();
    s.kill();
    s.restart().expect("restart");
    assert_eq!(s.command(&["GET", "k"]).unwrap(), "", "nil: nothing kept");
}

#[test]
fn a_paused_server_answers_nothing_until_resumed() {
    let s = RedisServer::start_durable().expect("redis-server");
    s.pause().expect("pause");
    // The kernel still accepts connections; nothing answers.
    assert!(!s.is_up());
    assert!(s.command(&["SET", "during", "pause"]).is_err());
    s.resume().expect("resume");
    assert!(s.is_up());
    // The command sent while it was stopped was queued and ran on resume.
    assert_eq!(s.command(&["GET", "during"]).unwrap(), "pause");
    // Dropping a paused server does not hang: the watchdog wakes it to die.
    s.pause().expect("pause");
    drop(s);
}

#[test]
fn debug_sleep_blocks_the_server_without_blocking_the_caller() {
    let s = RedisServer::start_durable().expect("redis-server");
    let start = Instant::now();
    let sleeping = s.debug_sleep(1.5).expect("debug sleep");
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "returns at once"
    );
    assert!(!s.is_up(), "asleep: PING unanswered for 500 ms");
    sleeping.join().unwrap().expect("+OK after the sleep");
    assert!(start.elapsed() >= Duration::from_millis(1_500));
    assert!(s.is_up());
    // Without `debug`, Redis 7 refuses the command.
    let plain = RedisServer::start().expect("redis-server");
    assert!(plain.debug_sleep(0.1).unwrap().join().unwrap().is_err());
}

#[test]
fn client_pause_holds_commands() {
    let s = RedisServer::start().expect("redis-server");
    s.client_pause(1_200).expect("client pause");
    let start = Instant::now();
    s.command(&["SET", "k", "v"])
        .expect("answered after the pause");
    assert!(
        start.elapsed() >= Duration::from_millis(800),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_killed_master_fails_over_to_its_replica() {
    let mut c = RedisCluster::start_with_replicas().expect("cluster");
    assert_eq!(c.nodes().len(), 6);
    assert_eq!(c.urls().len(), 6);
    let key = "tg:turn2:{alice}";
    let slot = key_slot(key);
    let master = c.master_of(slot).expect("master");
    let m = c.nodes().iter().find(|n| n.port() == master).unwrap();
    assert_eq!(
        m.command(&["CLUSTER", "KEYSLOT", key]).unwrap(),
        slot.to_string()
    );
    assert_eq!(
        key_slot("no tag"),
        m.command(&["CLUSTER", "KEYSLOT", "no tag"])
            .unwrap()
            .parse::<u16>()
            .unwrap()
    );
    assert_eq!(
        key_slot("{}x"),
        m.command(&["CLUSTER", "KEYSLOT", "{}x"])
            .unwrap()
            .parse::<u16>()
            .unwrap()
    );
    m.command(&["SET", key, "1"]).unwrap();
    // Acknowledged by the replica too before the kill.
    assert_eq!(m.command(&["WAIT", "1", "2000"]).unwrap(), "1");

    let f = c.kill_master_of(slot).expect("failover");
    assert_eq!(f.killed, master);
    assert_ne!(f.promoted, master);
    assert!(f.took < Duration::from_secs(15));
    eprintln!(
        "failover of slot {slot}: {} -> {} in {:?}",
        f.killed, f.promoted, f.took
    );
    let p = c.nodes().iter().find(|n| n.port() == f.promoted).unwrap();
    assert_eq!(p.command(&["GET", key]).unwrap(), "1");

    // The old master comes back as a replica; a second kill fails back.
    c.restart_node(master).expect("rejoin");
    assert_eq!(c.master_of(slot).unwrap(), f.promoted);
    let back = c.kill_master_of(slot).expect("second failover");
    assert_eq!(back.promoted, master);
}
