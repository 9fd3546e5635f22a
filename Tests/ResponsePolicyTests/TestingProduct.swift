@_exported import ResponsePolicyTesting
// The testing product (virtual clock, seeded randomness, the simulator) for every file of
// this test target, as ResponsePolicy is; and the doubles every engine test target shares
// (basePolicy, RecordingTransport, the coordination fixtures).
@_exported import TestSupport
