//! Each check fails on the mismatch it is for, naming the fix, and passes on a sound pair.

use super::*;
use crate::facts::Facts;

const SOUND: &str = "kernel=6.8.0-1015-nvidia\ndriver=580.95.05\nif_state=up\nif_mtu=9000\nif_speed=200000\n\
gid=0000:0000:0000:0000:0000:ffff:c0a8:6401\nmem_available_kib=120000000\ndisk_free_kib=500000000\n\
weights=present\nweight=config.json\t12\nweight=model-00001.safetensors\t4096\npeer=answers\n";

fn pair(worker: &str) -> Vec<Seen> {
    let node = |name: &str, text: &str| Seen {
        node: name.into(),
        facts: Some(Facts::parse(text)),
        image: Some(Ok("sha256:aaa/cfg1".into())),
        ..Seen::default()
    };
    let mut w = node("worker", worker);
    w.clock = Some((0.01, 0.002));
    vec![node("head", SOUND), w]
}

fn limits() -> Limits {
    Limits {
        memory_gib: Some(100.0),
        min_free_disk_gib: Some(2.0),
        max_skew_s: 0.5,
        ports: vec![("VLLM_PORT".into(), 18888, true)],
        image: "dsv41:latest".into(),
        loopback: false,
    }
}

fn failed(rows: &[Row]) -> Vec<(Check, &str)> {
    rows.iter()
        .filter(|r| r.verdict == Verdict::Fail)
        .map(|r| (r.check, r.node.as_str()))
        .collect()
}

#[test]
fn a_sound_pair_passes_every_check() {
    let rows = judge(&limits(), &pair(SOUND));
    assert_eq!(failed(&rows), [], "{rows:#?}");
    for check in [
        Check::Ssh,
        Check::ImageDigest,
        Check::Kernel,
        Check::Driver,
        Check::Interface,
        Check::Peer,
        Check::RoceGid,
        Check::Clock,
        Check::Memory,
        Check::Disk,
        Check::Weights,
        Check::Ports,
    ] {
        assert!(
            rows.iter().any(|r| r.check == check && r.verdict == Verdict::Pass),
            "{check:?}: {rows:#?}"
        );
    }
}

#[test]
fn each_mismatch_fails_its_row_with_the_fix() {
    let cases: [(&str, &str, Check, &str); 6] = [
        ("if_mtu=9000", "if_mtu=1500", Check::Interface, "MTU"),
        ("if_state=up", "if_state=down", Check::Interface, "bring the link up"),
        (
            "kernel=6.8.0-1015-nvidia",
            "kernel=6.8.0-1017-nvidia",
            Check::Kernel,
            "same kernel",
        ),
        ("weight=config.json\t12\n", "", Check::Weights, "sparkgate sync"),
        (
            "model-00001.safetensors\t4096",
            "model-00001.safetensors\t1000",
            Check::Weights,
            "cut short",
        ),
        (
            "gid=0000:0000:0000:0000:0000:ffff:c0a8:6401",
            "gid=0000:0000:0000:0000:0000:0000:0000:0000",
            Check::RoceGid,
            "GID",
        ),
    ];
    for (from, to, check, fix) in cases {
        let rows = judge(&limits(), &pair(&SOUND.replace(from, to)));
        assert_eq!(failed(&rows), [(check, "worker")], "{from} → {to}: {rows:#?}");
        let row = rows.iter().find(|r| r.verdict == Verdict::Fail).unwrap();
        assert!(row.fix.contains(fix) || row.found.contains(fix), "{row:?}");
    }
}

#[test]
fn skew_ports_daemon_image_and_ssh_fail_their_rows() {
    let mut nodes = pair(SOUND);
    nodes[1].clock = Some((2.0, 0.01));
    nodes[1].image = Some(Ok("sha256:bbb/cfg1".into()));
    let mut l = limits();
    l.ports[0].2 = false;
    let rows = judge(&l, &nodes);
    let f = failed(&rows);
    for want in [
        (Check::Clock, "worker"),
        (Check::ImageDigest, "worker"),
        (Check::Ports, "head"),
    ] {
        assert!(f.contains(&want), "{want:?}: {rows:#?}");
    }
    nodes[1].image = Some(Err("daemon: cannot connect to /var/run/docker.sock".into()));
    nodes[1].unreachable = None;
    let rows = judge(&limits(), &nodes);
    assert!(failed(&rows).contains(&(Check::DockerDaemon, "worker")), "{rows:#?}");
    let lost = Seen {
        node: "worker".into(),
        unreachable: Some("Permission denied (publickey)".into()),
        ..Seen::default()
    };
    let rows = judge(&limits(), &[pair(SOUND).remove(0), lost]);
    assert_eq!(failed(&rows), [(Check::Ssh, "worker")], "{rows:#?}");
}

#[test]
fn a_node_without_a_gpu_or_roce_device_skips_those_rows() {
    let bare = SOUND
        .replace("driver=580.95.05", "driver=")
        .replace("gid=0000:0000:0000:0000:0000:ffff:c0a8:6401", "gid=");
    let mut nodes = pair(&bare);
    nodes[0] = nodes[1].clone();
    nodes[0].node = "head".into();
    let rows = judge(&limits(), &nodes);
    assert_eq!(failed(&rows), [], "{rows:#?}");
    assert!(rows
        .iter()
        .any(|r| r.check == Check::Driver && r.verdict == Verdict::Skip));
    assert!(rows
        .iter()
        .any(|r| r.check == Check::RoceGid && r.verdict == Verdict::Skip));
}

#[test]
fn a_missing_interface_fails_a_real_pair_and_is_skipped_over_loopback() {
    let gone = SOUND.replace("if_state=up\n", "");
    let rows = judge(&limits(), &pair(&gone));
    assert_eq!(failed(&rows), [(Check::Interface, "worker")], "{rows:#?}");
    let l = Limits {
        loopback: true,
        ..limits()
    };
    let rows = judge(&l, &pair(&gone));
    assert_eq!(failed(&rows), [], "{rows:#?}");
}
