"""Algorithms decide who sends what to whom and when; they see only the Backend interface.

Each takes ``(backend, ctx, call)`` where ``call`` is a :class:`collectives.call.Call` holding the
flat storage buffers, and leaves the result in the call's output buffer.
"""
