use super::*;

#[test]
fn reservation_id_round_trips() {
    let id = ReservationId::new("inv.with.dots", 12);
    assert_eq!(id.to_string(), "12.inv.with.dots");
    assert_eq!("12.inv.with.dots".parse::<ReservationId>().unwrap(), id);
    let local = ReservationId {
        fallback: Some(0xab),
        ..id.clone()
    };
    assert_eq!(local.to_string(), "f000000ab.12.inv.with.dots");
    assert_eq!(local.to_string().parse::<ReservationId>().unwrap(), local);
    assert_ne!(local, id);
    for bad in [
        "",
        "x.inv",
        "0.inv",
        "3.",
        "03.inv",
        "12",
        "+1.inv",
        "f.1.inv",
        "fab.1.inv",
        "f000000AB.1.inv",
        "f000000ab.inv",
        "f000000ab.0.inv",
    ] {
        assert!(bad.parse::<ReservationId>().is_err(), "{bad}");
    }
}
