"""One way to serve many local clients from one thread, shared by the simulated KFD's server and the
xsched-lv3 daemon: a listening socket and non-blocking connections in a selector, each connection
watched for what it can do next, so a client that sends garbage, never reads or disappears costs
only its own connection. Stdlib only (the simulator may import it, like kfdtool.pids)."""
import selectors
import time

ACCEPT_PAUSE_S = 1.0                # out of fds: leave new connections in the backlog this long


class ConnectionLoop:
    """Mixed into a server that has `sel` (a selector), `listener` (a non-blocking listening
    socket registered as ("listen", None)), `log(text)` and `accept_paused_until` (0.0), and
    defines, per connection (`conn.sock`, `conn.outbox`, `conn.events`, `conn.closed`):
      _admit(sock) -> conn, or None after refusing and closing it
      _receive(conn), _take_requests(conn), _flush(conn)
      _connection_closed(conn): drop whatever else it keeps of a connection being closed
      _on_exit(pid): a process watched with kfdtool.pids.ExitWatch exited
    Its select loop hands every event to `_handle_event(kind, obj, events)` first, and handles the kinds
    of its own where that returns False; it calls `_resume_accepting()` after every round."""

    def _handle_event(self, kind, obj, events):
        """The events every such server has: new connections, connections, exited processes."""
        if kind == "listen":
            self._accept()
        elif kind == "conn":
            self._on_socket(obj, events)
        elif kind == "pidfd":
            self._on_exit(obj)
        else:
            return False
        return True

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as e:                # EMFILE/ENFILE: leave the rest in the backlog a while
                self.log(f"accept failed ({e.strerror}); not accepting for {ACCEPT_PAUSE_S:g} s")
                self.sel.unregister(self.listener)
                self.accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S
                return
            sock.setblocking(False)
            conn = self._admit(sock)
            if conn is not None:
                self._watch(conn)

    def _resume_accepting(self):
        if self.accept_paused_until and time.monotonic() >= self.accept_paused_until:
            self.accept_paused_until = 0.0
            self.sel.register(self.listener, selectors.EVENT_READ, ("listen", None))

    def _watch(self, conn):
        """Watch `conn` for what it can do next: take its replies, or send requests. Nothing is read
        from a client that has not taken its last reply, so its buffers stay bounded."""
        if conn.closed:
            return
        events = selectors.EVENT_WRITE if conn.outbox else selectors.EVENT_READ
        if events != conn.events:
            if conn.events:
                self.sel.modify(conn.sock, events, ("conn", conn))
            else:
                self.sel.register(conn.sock, events, ("conn", conn))
            conn.events = events

    def _on_socket(self, conn, events):
        if events & selectors.EVENT_WRITE:
            self._flush(conn)
        elif events & selectors.EVENT_READ:
            self._receive(conn)
        self._take_requests(conn)
        self._watch(conn)

    def _close(self, conn, reason):
        """Close `conn` (logging `reason`, if any: None for an orderly close). Safe to call twice."""
        if conn.closed:
            return
        if reason:
            self.log(f"closed {conn}: {reason}")
        conn.closed = True
        if conn.events:
            self.sel.unregister(conn.sock)
        conn.sock.close()
        conn.inbox.clear()
        self._connection_closed(conn)
        conn.outbox.clear()
