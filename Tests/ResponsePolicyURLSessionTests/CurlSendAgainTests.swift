import Foundation
import ResponsePolicy
import ResponsePolicyCurl
import TestGate
import Testing

/// `CurlTransport` sends a request again, once, on a new connection, when its connection failed
/// before a byte of an answer came back and the server cannot have acted on it: a `GET` or
/// `HEAD`, or a request whose body did not all go out (an HTTP/2 connection a load balancer
/// closes with `GOAWAY` fails some requests starting on it so with libcurl 7.88, and a reset
/// while a body is being written fails its send; issue 33). A request whose body went out whole
/// is never sent again by the transport: a token call's refresh token is presented once (SPEC:
/// "The refresh token is irreplaceable").
///
/// `/close` reads the whole request and closes the connection without answering: the worst
/// case, a server that may have acted on it.
@Suite(.measuresRealTime(filter: "CurlSendAgainTests"), .loadGate(.realTime))
struct CurlSendAgainTests {
    @Test func aGETThatGotNothingGoesAgainOnceAndABodyThatWentOutNever() async throws {
        try await withTestServer { server in
            let transport = CurlTransport(timeout: .seconds(10))
            await #expect(throws: TransportError.self) {
                try await transport.send(HTTPRequest(url: server.url("/close?n=get")))
            }
            await #expect(throws: TransportError.self) {
                try await transport.send(HTTPRequest(method: "HEAD", url: server.url("/close?n=head")))
            }
            let token = Data("grant_type=refresh_token&refresh_token=r-spent-once".utf8)
            for method in ["POST", "PUT", "PATCH"] {
                await #expect(throws: TransportError.self) {
                    try await transport.send(
                        HTTPRequest(
                            method: method, url: server.url("/close?n=\(method)"),
                            headers: ["Content-Type": "application/x-www-form-urlencoded"], body: token))
                }
            }
            // Without a body, or with an empty one (whole as soon as the head is), a method that
            // is not safe is not sent again either.
            await #expect(throws: TransportError.self) {
                try await transport.send(HTTPRequest(method: "DELETE", url: server.url("/close?n=delete")))
            }
            await #expect(throws: TransportError.self) {
                try await transport.send(HTTPRequest(method: "POST", url: server.url("/close?n=empty"), body: Data()))
            }
            let received = try await server.requests().map { "\($0.method) \($0.query)" }
            #expect(
                received == [
                    "GET n=get", "GET n=get", "HEAD n=head", "HEAD n=head", "POST n=POST", "PUT n=PUT", "PATCH n=PATCH",
                    "DELETE n=delete", "POST n=empty",
                ])
        }
    }

    /// The server reads the head and resets the connection, the body unread: the client's send
    /// fails midway (libcurl does not send it again itself on a new connection), the body did not
    /// all go out, so the request goes again, whole, and is answered. (A kept-alive connection
    /// that a server resets while a request is still being written meets the same.)
    @Test func aBodyCutOffByAResetGoesAgainWhole() async throws {
        try await withTestServer { server in
            let transport = CurlTransport(timeout: .seconds(30))
            let body = Data(repeating: 0x61, count: 8 << 20)
            let response = try await transport.send(
                HTTPRequest(
                    method: "POST", url: server.url("/reset-before-body"),
                    headers: ["Content-Type": "application/octet-stream"], body: body))
            #expect(response.status == 200)
            struct Received: Decodable { var received: Int }
            #expect(try JSONDecoder().decode(Received.self, from: response.body).received == body.count)
            #expect(try await server.stats().counters["reset_before_body_calls"] == 2)
        }
    }

    /// An answer that began and broke off is an answer: never sent again, whatever the method.
    @Test func aGETWhoseAnswerBrokeOffIsNotSentAgain() async throws {
        try await withTestServer { server in
            try await server.control(["drop_count": 1])
            let transport = CurlTransport(timeout: .seconds(10))
            await #expect(throws: TransportError.self) {
                try await transport.send(HTTPRequest(url: server.url("/drop")))
            }
            #expect(try await server.requests().count == 1)
        }
    }
}
