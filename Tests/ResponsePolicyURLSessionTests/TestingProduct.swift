// The testing product (virtual clock, seeded randomness, the simulator) for every file of
// this test target, as ResponsePolicy is.
@_exported import ResponsePolicyTesting
