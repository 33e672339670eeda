//! Encoding of packed repeated enum fields (`LinuxScheduler.flags`,
//! `LinuxMemoryPolicy.flags`), used by the generated code instead of
//! rust-protobuf's own functions (`build.rs` rewrites the calls).
//!
//! Why: an enum is an `int32` on the wire, so a negative value is a 10-byte
//! varint (sign-extended to 64 bits), and rust-protobuf 3.7.2 writes it so.
//! But its size function for packed enums counts each value as a 32-bit
//! varint (at most 5 bytes), so both the length prefix it writes and
//! `compute_size()` come out 5 bytes short per negative value: the encoded
//! message is corrupt (the next field starts inside the packed data) and
//! every enclosing message's length is wrong too. A plugin can send a
//! negative flag, and the runtime re-encodes what it received (the
//! adjustment it passes to validators, replay records), so this is not
//! only a theoretical value. Here the size of each value is that of the
//! `int32` it is, as for packed `int32` fields, which rust-protobuf gets
//! right.

use protobuf::{
    CodedOutputStream, Enum, EnumOrUnknown,
    rt::{self, WireType},
};

/// Bytes of the packed data (without tag and length prefix).
fn data_size<E: Enum>(values: &[EnumOrUnknown<E>]) -> u64 {
    values
        .iter()
        .map(|v| rt::compute_raw_varint64_size(i64::from(v.value()) as u64))
        .sum()
}

/// Encoded size of packed field `field` holding `values`, with tag and
/// length prefix; 0 for no values (an empty packed field is not written).
pub(crate) fn vec_packed_enum_size<E: Enum>(field: u32, values: &[EnumOrUnknown<E>]) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let data = data_size(values);
    rt::tag_size(field) + rt::compute_raw_varint64_size(data) + data
}

/// Writes packed field `field` holding `values` (nothing for no values):
/// tag, length of the data in bytes, then each value as an `int32` varint.
pub(crate) fn write_packed_enum<E: Enum>(
    os: &mut CodedOutputStream<'_>,
    field: u32,
    values: &[EnumOrUnknown<E>],
) -> protobuf::Result<()> {
    if values.is_empty() {
        return Ok(());
    }
    os.write_tag(field, WireType::LengthDelimited)?;
    os.write_raw_varint64(data_size(values))?;
    for v in values {
        os.write_enum_no_tag(v.value())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use protobuf::Message;

    use crate::api;

    /// The two fuzz findings (`fuzz/corpus/nri_messages/negative-*-flag`):
    /// plugin responses whose packed flags hold a negative value. Before
    /// the rewrite their re-encoding was 5 bytes longer than
    /// `compute_size()` and did not decode to the same message.
    #[test]
    fn fuzz_findings_with_negative_packed_flags_reencode_exactly() {
        let findings: [&[u8]; 2] = [
            include_bytes!("../../fuzz/corpus/nri_messages/negative-scheduler-flag"),
            include_bytes!("../../fuzz/corpus/nri_messages/negative-mpol-flag"),
        ];
        for input in findings {
            // The first byte selects the message type in the fuzz target.
            let m = api::CreateContainerResponse::parse_from_bytes(&input[1..]).unwrap();
            let bytes = m.write_to_bytes().unwrap();
            assert_eq!(bytes.len() as u64, m.compute_size());
            assert_eq!(api::CreateContainerResponse::parse_from_bytes(&bytes).unwrap(), m);
        }
    }

    #[test]
    fn negative_flags_are_ten_byte_varints_and_round_trip() {
        let sched = api::LinuxScheduler {
            flags: vec![
                api::LinuxSchedulerFlag::SCHED_FLAG_RESET_ON_FORK.into(),
                protobuf::EnumOrUnknown::from_i32(-1),
                protobuf::EnumOrUnknown::from_i32(i32::MIN),
            ],
            nice: 3,
            ..Default::default()
        };
        let bytes = sched.write_to_bytes().unwrap();
        // nice (field 2): 10 03; flags (field 4): 22, length 21, then
        // 1 + 10 + 10 bytes of data.
        assert_eq!(&bytes[..2], &[0x10, 0x03]);
        assert_eq!(&bytes[2..4], &[0x22, 21]);
        assert_eq!(bytes.len(), 4 + 21);
        assert_eq!(
            &bytes[5..15],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
        assert_eq!(sched.compute_size(), bytes.len() as u64);
        assert_eq!(api::LinuxScheduler::parse_from_bytes(&bytes).unwrap(), sched);

        let adj = api::ContainerAdjustment {
            linux: Some(api::LinuxContainerAdjustment {
                memory_policy: Some(api::LinuxMemoryPolicy {
                    flags: vec![protobuf::EnumOrUnknown::from_i32(-4387)],
                    ..Default::default()
                })
                .into(),
                scheduler: Some(sched).into(),
                ..Default::default()
            })
            .into(),
            ..Default::default()
        };
        let bytes = adj.write_to_bytes().unwrap();
        assert_eq!(adj.compute_size(), bytes.len() as u64);
        assert_eq!(api::ContainerAdjustment::parse_from_bytes(&bytes).unwrap(), adj);
    }
}
