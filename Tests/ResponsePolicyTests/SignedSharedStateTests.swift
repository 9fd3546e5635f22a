import Foundation
import Synchronization
import TestSupport
import Testing

@testable import ResponsePolicy

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 23: with `signing-key-env`, every value read from the file store is authenticated. The
/// state file is sealed as one value (every field, with a revision): a field forged alone, a
/// record sealed with another key, or an older copy put back is refused with a `problem` naming
/// the file, and is coordination trouble (`.unavailable`): never a logout, never the attacker's
/// credentials.
struct SignedSharedStateTests {
    static let key = Data("fleet-key".utf8)

    /// A sealed state file with every field set: credentials, a lease, a failure, a cooldown, the
    /// refresh.limit grants, and the revision its writes gave it.
    static func sealedState(_ folder: CoordinationRecordTests.Folder) async throws -> (String, [String: Any]) {
        let credentials = folder.path + "/credentials.json"
        let writer = try FileSessionCoordinator(.init(path: credentials, signingKey: key))
        defer { writer.stop() }
        _ = await writer.start(local: testCredentials("seed"), updates: { _ in })
        let limit = (count: 5, per: Duration.seconds(3600))
        guard
            case .lease(let first) = await writer.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(1), limit: limit))
        else { throw CoordinationError("no first lease") }
        // Generation 1, refused at once: a loop `refresh.limit` counts (issue 29).
        _ = await writer.publish(testCredentials("rotated"), with: first)
        guard
            case .lease(let second) = await writer.beginRefresh(
                .init(failedGeneration: 1, timeout: .seconds(1), limit: limit))
        else { throw CoordinationError("no second lease") }
        await writer.endRefresh(second, failure: "invalid_grant elsewhere")
        _ = await writer.beginRefresh(.init(failedGeneration: 1, timeout: .seconds(1), limit: limit))
        // The token endpoint's Retry-After, kept with the (ended) second turn's failure.
        await writer.endRefresh(
            second, failure: "invalid_grant elsewhere", retryAfter: Date().addingTimeInterval(600))
        await writer.publishLogout(until: Date().addingTimeInterval(600), reason: "revoked")
        let path = credentials + ".shared"
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        let object = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        return (credentials, object)
    }

    /// Each edit changes one field of the sealed file, as a hostile writer would.
    static var forgeries: [(String, ([String: Any]) -> [String: Any])] {
        [
            (
                "generation",
                {
                    var o = $0; o["generation"] = 9; return o
                }
            ),
            (
                "fence",
                {
                    var o = $0; o["fence"] = 0; return o
                }
            ),
            (
                "revision",
                {
                    var o = $0; o["revision"] = 999; return o
                }
            ),
            (
                "access_token",
                {
                    var o = $0;
                    o["credentials"] = [
                        "access_token": "attacker", "refresh_token": "refresh-seed", "expires_at": 2_000_000_000_000,
                    ]; return o
                }
            ),
            (
                "refresh_token",
                {
                    var o = $0;
                    o["credentials"] = [
                        "access_token": "access-seed", "refresh_token": "attacker", "expires_at": 2_000_000_000_000,
                    ]; return o
                }
            ),
            (
                "expires_at",
                {
                    var o = $0;
                    o["credentials"] = [
                        "access_token": "access-seed", "refresh_token": "refresh-seed", "expires_at": 1,
                    ]; return o
                }
            ),
            (
                "lease.fence",
                {
                    var o = $0; var l = o["lease"] as? [String: Any] ?? [:]; l["fence"] = 77; o["lease"] = l; return o
                }
            ),
            (
                "lease.pid",
                {
                    var o = $0; var l = o["lease"] as? [String: Any] ?? [:]; l["pid"] = 1; o["lease"] = l; return o
                }
            ),
            (
                "lease.expires",
                {
                    var o = $0; var l = o["lease"] as? [String: Any] ?? [:]; l["expires"] = 253_402_300_799_000;
                    o["lease"] = l; return o
                }
            ),
            (
                "logged-out-until",
                {
                    var o = $0; o["logged-out-until"] = 253_402_300_799_000; return o
                }
            ),
            (
                "failure",
                {
                    var o = $0; o["failure"] = ["fence": 2, "reason": "forged"]; return o
                }
            ),
            (
                "refreshes",
                {
                    var o = $0; o["refreshes"] = Array(repeating: 2_000_000_000_000, count: 50); return o
                }
            ),
            (
                "retry-after",
                {
                    var o = $0; o["retry-after"] = ["until": 253_402_300_799_000, "reason": "forged"]; return o
                }
            ),
            (
                "loops",
                {
                    var o = $0; o["loops"] = nil; return o
                }
            ),
            (
                "accepted",
                {
                    var o = $0; o["accepted"] = 1; return o
                }
            ),
            (
                "no seal",
                {
                    var o = $0; o["seal"] = nil; return o
                }
            ),
            (
                "another key",
                {
                    var o = $0;
                    o["seal"] = SharedStateSigner(key: Data("other".utf8), scope: "file").seal("record", []); return o
                }
            ),
        ]
    }

    @Test func eachForgedFieldOfTheStateFileIsRefusedAsCoordinationTrouble() async throws {
        let folder = try CoordinationRecordTests.Folder()
        let (credentials, sealed) = try await Self.sealedState(folder)
        let state = credentials + ".shared"
        #expect(sealed["seal"] is String && sealed["lease"] != nil && sealed["failure"] != nil)
        #expect(sealed["logged-out-until"] != nil && sealed["loops"] != nil && sealed["retry-after"] != nil)
        for (field, forge) in Self.forgeries {
            let data = try JSONSerialization.data(withJSONObject: forge(sealed), options: [.sortedKeys])
            #expect(FileSessionCoordinator.replaceFile(state, with: data) == nil)
            let reader = try FileSessionCoordinator(.init(path: credentials, signingKey: Self.key))
            let log = UpdateLog()
            let shared = await reader.start(local: testCredentials("local"), updates: log.sink)
            let turn = await reader.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
            reader.stop()
            #expect(shared == nil, "\(field): a forged record was joined")
            guard case .unavailable(let reason) = turn else {
                Issue.record("\(field): a forged record gave \(turn)")
                continue
            }
            #expect(reason.contains(state) && reason.contains("signing-key-env"), "\(field): \(reason)")
            let problems = log.updates.compactMap { if case .problem(let text) = $0 { text } else { nil } }
            #expect(problems.contains { $0.contains(state) }, "\(field): no problem named the file")
            #expect(!log.updates.contains { if case .loggedOut = $0 { true } else { false } }, "\(field)")
            #expect(!log.updates.contains { if case .credentials = $0 { true } else { false } }, "\(field)")
            #expect(!problems.joined().contains("attacker") && !problems.joined().contains("access-seed"))
        }
        // The untouched record is accepted, and so the refusals above are the seal's doing.
        let data = try JSONSerialization.data(withJSONObject: sealed, options: [.sortedKeys])
        #expect(FileSessionCoordinator.replaceFile(state, with: data) == nil)
        guard
            case .success(let record?) = FileSessionCoordinator.read(
                state, signer: SharedStateSigner(key: Self.key, scope: "file"))
        else { return recordFailure("the sealed record was refused") }
        #expect(record.credentials == testCredentials("rotated") && record.lease != nil && record.revision > 1)
        #expect(record.loops.map(\.generation) == [1] && record.embargo?.reason == "invalid_grant elsewhere")
    }

    @Test func anOlderSealedCopyPutBackIsRefusedByAProcessThatSawANewerOne() async throws {
        let folder = try CoordinationRecordTests.Folder()
        let credentials = folder.path + "/credentials.json"
        let state = credentials + ".shared"
        // A short lease: the re-seed after the file is removed waits out a quarantine of one.
        let process = try FileSessionCoordinator(
            .init(path: credentials, lease: .milliseconds(300), signingKey: Self.key))
        defer { process.stop() }
        let log = UpdateLog()
        _ = await process.start(local: testCredentials("seed"), updates: log.sink)
        let old = try Data(contentsOf: URL(fileURLWithPath: state))
        guard
            case .lease(let lease) = await process.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else { return recordFailure("no lease") }
        _ = await process.publish(testCredentials("rotated"), with: lease)
        // The old copy (generation 0, the spent refresh token) is validly sealed, but older.
        #expect(FileSessionCoordinator.replaceFile(state, with: old) == nil)
        let turn = await process.beginRefresh(.init(failedGeneration: 1, timeout: .seconds(1), limit: nil))
        guard case .unavailable(let reason) = turn else { return recordFailure("a replayed record gave \(turn)") }
        #expect(reason.contains("replayed") && reason.contains(state))
        // (It may hear of its own publication; never of the old pair again.)
        #expect(
            !log.updates.contains {
                if case .credentials(let s) = $0 { s.credentials == testCredentials("seed") } else { false }
            })
        // Removing the file is the fix: the process re-seeds it with the newest pair it holds
        // (generation 1, never the spent one), going on from the revision already seen, with a
        // quarantine of one lease unless it has watched the file for a whole lease (a holder the
        // lost file knew of may still publish): a turn after it is granted a lease.
        try FileManager.default.removeItem(atPath: state)
        var again = await process.beginRefresh(.init(failedGeneration: 1, timeout: .milliseconds(100), limit: nil))
        if case .failedElsewhere(let why) = again {
            #expect(why.contains("forgot"), "\(why)")
            again = await process.beginRefresh(.init(failedGeneration: 1, timeout: .seconds(2), limit: nil))
        }
        guard case .lease(let next) = again else {
            return recordFailure("no lease after the file was removed: \(again)")
        }
        #expect(next.generation == 1 && next.fencingToken > lease.fencingToken)
        let signer = SharedStateSigner(key: Self.key, scope: "file")
        guard case .success(let reseeded?) = FileSessionCoordinator.read(state, signer: signer)
        else { return recordFailure("the re-seeded record was refused") }
        #expect(reseeded.credentials == testCredentials("rotated") && reseeded.generation == 1)
    }

    /// A genuine logout put back after a sign-in ended it (the record it was stored in, validly
    /// sealed) is an older revision: refused by every process that saw the sign-in, with a problem
    /// naming the file, never applied.
    @Test func aLogoutPutBackAfterASignInIsRefused() async throws {
        let folder = try CoordinationRecordTests.Folder()
        let credentials = folder.path + "/credentials.json"
        let state = credentials + ".shared"
        let decider = try FileSessionCoordinator(.init(path: credentials, signingKey: Self.key))
        let listener = try FileSessionCoordinator(.init(path: credentials, signingKey: Self.key))
        defer { [decider, listener].forEach { $0.stop() } }
        let log = UpdateLog()
        _ = await decider.start(local: testCredentials("seed"), updates: { _ in })
        _ = await listener.start(local: nil, updates: log.sink)
        await decider.publishLogout(until: Date().addingTimeInterval(600), reason: "revoked")
        #expect(await log.first(within: .seconds(5)) { if case .loggedOut = $0 { true } else { false } } != nil)
        let loggedOut = try Data(contentsOf: URL(fileURLWithPath: state))
        let signedIn = try #require(await decider.publishSignIn(testCredentials("signed-in")))
        let heard = await log.first(within: .seconds(5)) {
            if case .credentials(let s) = $0 { s.generation == signedIn.generation } else { false }
        }
        #expect(heard != nil, "the listener never read the sign-in")
        let mark = log.updates.count
        #expect(FileSessionCoordinator.replaceFile(state, with: loggedOut) == nil)
        let problem = await log.first(within: .seconds(5)) {
            if case .problem(let text) = $0 { text.contains(state) && text.contains("replayed") } else { false }
        }
        #expect(problem != nil, "\(log.updates)")
        #expect(!log.updates.dropFirst(mark).contains { if case .loggedOut = $0 { true } else { false } })
        for process in [decider, listener] {
            let turn = await process.beginRefresh(
                .init(failedGeneration: signedIn.generation, timeout: .seconds(1), limit: nil))
            guard case .unavailable(let reason) = turn else { return recordFailure("a replayed logout gave \(turn)") }
            #expect(reason.contains("replayed") && reason.contains(state))
        }
    }

    @Test func withoutAKeyTheRecordIsUnsealedAndAKeyedProcessRefusesIt() async throws {
        let folder = try CoordinationRecordTests.Folder()
        let credentials = folder.path + "/credentials.json"
        let unkeyed = try FileSessionCoordinator(.init(path: credentials))
        _ = await unkeyed.start(local: testCredentials("seed"), updates: { _ in })
        unkeyed.stop()
        let object = try JSONSerialization.jsonObject(
            with: Data(contentsOf: URL(fileURLWithPath: credentials + ".shared")))
        #expect((object as? [String: Any])?["seal"] == nil)
        let keyed = try FileSessionCoordinator(.init(path: credentials, signingKey: Self.key))
        defer { keyed.stop() }
        #expect(await keyed.start(local: testCredentials("local"), updates: { _ in }) == nil)
        guard
            case .unavailable(let reason) = await keyed.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else { return recordFailure("an unsealed record was used under a key") }
        #expect(reason.contains("not signed with this fleet's key"))
    }
}

/// Issue 23: the temporary files the state file and the credentials file are written through.
/// Links are planted at exactly the names the code will pick (the generator is replaced for the
/// test's task): each is refused (`O_EXCL | O_NOFOLLOW`), the victim is untouched, and the write
/// either lands safely under a free name (0600) or is refused with the reason.
struct PlantedTemporaryLinkTests {
    final class Names: Sendable {
        private let next = Mutex<UInt64>(0)
        let base: UInt64
        init(base: UInt64) { self.base = base }
        func draw() -> UInt64 {
            next.withLock { n in
                defer { n += 1 }; return base + n
            }
        }
    }

    static func victim(in folder: String) throws -> String {
        let victim = folder + "/victim"
        try Data("victim".utf8).write(to: URL(fileURLWithPath: victim))
        chmod(victim, 0o644)
        return victim
    }

    static func untouched(_ victim: String) throws -> Bool {
        var info = stat()
        return try String(contentsOfFile: victim, encoding: .utf8) == "victim" && stat(victim, &info) == 0
            && info.st_mode & 0o777 == 0o644
    }

    @Test(arguments: [3, 8])
    func theStateFileWriterNeverFollowsALinkAtItsTemporaryNames(planted: Int) throws {
        let folder = try CoordinationRecordTests.Folder()
        let state = folder.path + "/credentials.json.shared"
        let victim = try Self.victim(in: folder.path)
        let names = Names(base: 0x5eed_0000)
        for n in 0..<UInt64(planted) { symlink(victim, state + ".tmp-\(getpid())-\(names.base + n)") }
        var record = CoordinationRecord()
        record.credentials = Credentials(accessToken: "secret-token")
        let error = TemporaryNames.$override.withValue({ names.draw() }) {
            FileSessionCoordinator.write(record, to: state)
        }
        #expect(try Self.untouched(victim))
        if planted >= 8 {
            // Every name it may try is taken: refused, nothing written anywhere.
            #expect(error != nil)
            #expect(!FileManager.default.fileExists(atPath: state))
        } else {
            #expect(error == nil)
            var info = stat()
            #expect(lstat(state, &info) == 0 && info.st_mode & S_IFMT == S_IFREG && info.st_mode & 0o777 == 0o600)
        }
        // A link at the state path itself is replaced by the rename, never written through.
        try? FileManager.default.removeItem(atPath: state)
        symlink(victim, state)
        #expect(FileSessionCoordinator.write(record, to: state) == nil)
        #expect(try Self.untouched(victim))
        var info = stat()
        #expect(lstat(state, &info) == 0 && info.st_mode & S_IFMT == S_IFREG)
    }

    @Test(arguments: [3, 8])
    func theCredentialsSaverNeverFollowsALinkAtItsTemporaryNames(planted: Int) throws {
        let folder = try CoordinationRecordTests.Folder()
        let path = folder.path + "/credentials.json"
        let victim = try Self.victim(in: folder.path)
        let names = Names(base: 0xabc0_0000)
        for n in 0..<UInt64(planted) {
            symlink(victim, folder.path + "/.credentials.json.tmp-\(getpid())-" + String(names.base + n, radix: 16))
        }
        let store = FileCredentialStore(path: path)
        let saved = TemporaryNames.$override.withValue({ names.draw() }) {
            Result { try store.save(Credentials(accessToken: "secret-token", refreshToken: "secret-refresh")) }
        }
        #expect(try Self.untouched(victim))
        if planted >= 8 {
            guard case .failure(let error) = saved else { return recordFailure("saved through 8 planted names") }
            #expect("\(error)".contains("temporary file"))
        } else {
            #expect((try? saved.get()) != nil)
            var info = stat()
            #expect(lstat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFREG && info.st_mode & 0o777 == 0o600)
            #expect(try store.load()?.accessToken == "secret-token")
        }
    }

    @Test func theDefaultNamesAreUnpredictable() {
        // 64 bits from the system's secure generator: 10,000 draws, no repeat, and both halves vary.
        let draws = (0..<10_000).map { _ in TemporaryNames.suffix() }
        #expect(Set(draws).count == draws.count)
        #expect(Set(draws.map { $0 >> 32 }).count > 9_000 && Set(draws.map { $0 & 0xffff_ffff }).count > 9_000)
    }
}
