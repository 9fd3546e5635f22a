import TestSupport
import Testing

@testable import ResponsePolicy

/// The timer heap against the obvious model (a list sorted by deadline, then scheduling order):
/// random schedules, moves, cancellations and pops must agree at every step, and every node's
/// index must be where the heap holds it.
@Suite struct TimerHeapTests {
    @Test(arguments: [1, 2, 3, 42, 2_026])
    func agreesWithASortedListUnderRandomOperations(seed: UInt64) {
        var random = SeededGenerator(seed: seed)
        var heap = TimerHeap()
        var model: [(node: TimerNode, deadline: Duration, order: UInt64)] = []
        let nodes = (0..<64).map { _ in TimerNode() }
        var order: UInt64 = 0
        for _ in 0..<5_000 {
            let node = nodes[Int.random(in: 0..<nodes.count, using: &random)]
            switch Int.random(in: 0..<10, using: &random) {
            case 0..<5:
                // Few distinct deadlines, so ties (broken by scheduling order) are common.
                let deadline = Duration.milliseconds(Int.random(in: 0..<20, using: &random))
                order += 1
                heap.schedule(node, deadline: deadline, order: order, token: order)
                model.removeAll { $0.node === node }
                model.append((node, deadline, order))
            case 5..<8:
                heap.remove(node)
                model.removeAll { $0.node === node }
            default:
                model.sort { ($0.deadline, $0.order) < ($1.deadline, $1.order) }
                let expected = model.first?.node
                #expect(heap.first === expected)
                if let first = heap.first {
                    heap.remove(first)
                    model.removeFirst()
                }
            }
            #expect(heap.count == model.count)
            for (index, node) in heap.nodes.enumerated() { #expect(node.heapIndex == index) }
            for node in nodes where !model.contains(where: { $0.node === node }) { #expect(node.heapIndex == -1) }
        }
        // Drained in (deadline, order) order.
        model.sort { ($0.deadline, $0.order) < ($1.deadline, $1.order) }
        for entry in model {
            #expect(heap.first === entry.node)
            if let first = heap.first { heap.remove(first) }
        }
        #expect(heap.isEmpty)
    }

    @Test func removingANodeThatIsNotInTheHeapChangesNothing() {
        var heap = TimerHeap()
        let (a, b) = (TimerNode(), TimerNode())
        heap.schedule(a, deadline: .seconds(1), order: 1, token: 1)
        heap.remove(b)
        heap.remove(a)
        heap.remove(a)
        #expect(heap.isEmpty)
        #expect(a.heapIndex == -1)
    }
}
