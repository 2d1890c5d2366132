"""Server→client streams. Until the streaming issue lands, GET answers 405 and sessions hold no
live streams; ending a session has nothing to close."""


def close_session_streams(principal_key, session_id):
    return 0
