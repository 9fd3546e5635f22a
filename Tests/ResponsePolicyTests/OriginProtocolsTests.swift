import Foundation
import Testing

@testable import ResponsePolicy

/// What `dispatch: auto` remembers of each origin's protocol stays bounded, whatever origins the
/// service's input names: a table per origin for the life of the process is memory an attacker
/// (or a webhook list) sets.
struct OriginProtocolsTests {
    static func origin(_ index: Int) -> RedirectRules.Origin {
        RedirectRules.Origin(scheme: "https", host: "tenant-\(index).example.com", port: 443)
    }

    @Test func theTableStaysWithinItsCapacityAndKeepsWhatWasNotedLast() {
        let protocols = OriginProtocols()
        let many = OriginProtocols.capacity * 3 / 2
        for index in 0..<many { protocols.note(Self.origin(index), multiplexes: index % 2 == 0) }
        #expect(protocols.count == OriginProtocols.capacity)
        #expect(protocols.multiplexes(Self.origin(many - 1)) == false, "the last origin noted is known")
        protocols.note(Self.origin(many), multiplexes: true)
        #expect(protocols.multiplexes(Self.origin(many)) == true, "and the next")
        #expect(protocols.count == OriginProtocols.capacity)
        let known = (0...many).filter { protocols.multiplexes(Self.origin($0)) != nil }.count
        #expect(known == OriginProtocols.capacity)
    }

    @Test func anOriginAlreadyKnownChangesWithoutForgettingAnother() throws {
        let protocols = OriginProtocols()
        for index in 0..<OriginProtocols.capacity { protocols.note(Self.origin(index), multiplexes: false) }
        protocols.note(Self.origin(7), multiplexes: true)
        protocols.note(Self.origin(7), multiplexes: true)
        #expect(protocols.count == OriginProtocols.capacity)
        #expect(protocols.multiplexes(Self.origin(7)) == true)
        #expect((0..<OriginProtocols.capacity).allSatisfy { protocols.multiplexes(Self.origin($0)) != nil })
        // The same origin however it is written: the scheme's default port, the host's case.
        let spelled = try #require(URL(string: "HTTPS://TENANT-7.example.com:443/other"))
        #expect(protocols.multiplexes(RedirectRules.origin(spelled)) == true)
    }
}
