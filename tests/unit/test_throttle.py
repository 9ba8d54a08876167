"""The failed-authentication throttle never refuses valid credentials, and counts failures per realm.

The review's case: Alertmanager and a client sending bad tokens share an address (one NAT, one node). Before, the
bad client's failures locked the address out and Alertmanager got ``[200 x 4, then 429 x 6]``; operator-token
guessing counted against the webhook too.
"""

from __future__ import annotations

import pytest

from tests.payloads import alert, body, xid
from tests.webapps import OPERATOR, TOKEN, VIEWER, auth, make_app, webhook_settings

SHARED = {"REMOTE_ADDR": "10.1.2.3"}


@pytest.fixture
def client(tmp_path):
    settings = webhook_settings(tmp_path)
    settings.webhook.auth_failure_burst = 3
    settings.webhook.auth_failures_per_minute = 1.0
    return make_app(settings).test_client()


def test_alertmanager_sharing_an_address_with_a_guesser_is_never_refused(client):
    answers = []
    for n in range(10):  # one bad request, one delivery, in turn, from the same address
        client.post("/api/v1/alerts", data=body(alert(xid())), headers=auth("guess"), environ_base=SHARED)
        delivery = body(alert(xid(node=f"node{n}", job=str(100 + n))))
        answers.append(client.post("/api/v1/alerts", data=delivery, headers=auth(), environ_base=SHARED))
    assert [r.status_code for r in answers] == [200] * 10
    guess = client.post("/api/v1/alerts", data=body(alert(xid())), headers=auth("guess"), environ_base=SHARED)
    assert guess.status_code == 429 and guess.json["status"] == "error"  # the failures are still limited


@pytest.mark.parametrize(
    ("guessing", "valid"),
    [
        ("/api/v1/pause", ("/api/v1/alerts", TOKEN)),  # operator guessing vs the webhook
        ("/api/v1/alerts", ("/api/v1/pause", OPERATOR)),  # webhook guessing vs the operator
        ("/api/v1/incidents", ("/api/v1/alerts", TOKEN)),  # reader guessing vs the webhook
    ],
)
def test_failures_in_one_realm_do_not_limit_another(client, guessing, valid):
    for _ in range(3):
        if guessing == "/api/v1/incidents":
            client.get(guessing, headers=auth("guess"), environ_base=SHARED)
        else:
            client.post(guessing, data=body(alert(xid())), headers=auth("guess"), environ_base=SHARED)
    path, token = valid
    response = client.post(path, data=body(alert(xid())), headers=auth(token), environ_base=SHARED)
    assert response.status_code == 200, response.json


def test_every_realm_limits_its_own_failures_and_valid_credentials_still_pass(client):
    for path, token, method in (
        ("/api/v1/alerts", TOKEN, "post"),
        ("/api/v1/pause", OPERATOR, "post"),
        ("/api/v1/status", VIEWER, "get"),
    ):
        send = getattr(client, method)
        codes = [send(path, headers=auth("guess"), environ_base=SHARED).status_code for _ in range(5)]
        assert codes == [401, 401, 401, 429, 429], (path, codes)
        assert send(path, headers=auth(token), environ_base=SHARED).status_code != 429, path
