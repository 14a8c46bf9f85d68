"""A lease's ownership history as stored: read back as written, and a change a later release may add
is left out rather than making the lease unreadable."""

from __future__ import annotations

import json

from stepcore.store.leases import Change, decode_lease_body


def test_a_change_of_an_unknown_kind_is_left_out_and_the_lease_reads() -> None:
    body = {
        'origin': 'r1',
        'history': [
            {'what': 'taken', 'at': '2026-12-07T10:00:00+00:00', 'epoch': 1, 'owner': 'vm pid 7'},
            {'what': 'migrated', 'at': '2026-12-07T10:01:00+00:00', 'epoch': 1},
            {'what': 'refused', 'epoch': 1},
            'not a change',
            {'what': 'taken over', 'at': '2026-12-07T10:02:00+00:00', 'epoch': 2, 'previous': 'vm pid 7 at epoch 1'},
        ],
    }
    lease = decode_lease_body('r1', 2, 'running', 0.0, 0.0, json.dumps(body))
    assert [(c.what, c.epoch) for c in lease.history] == [(Change.TAKEN, 1), (Change.TAKEN_OVER, 2)]
    assert lease.history[1].describe() == 'taken over from vm pid 7 at epoch 1, now epoch 2'
    assert [c.kind for c in lease.history] == ['lease_taken', 'lease_taken_over']
