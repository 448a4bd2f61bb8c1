/*
 * notify.h - the systemd notification protocol (sd_notify(3)) without
 * libsystemd: one datagram to the unix socket named by $NOTIFY_SOCKET.
 * Used for READY=1, RELOADING=1 and STOPPING=1 with Type=notify units.
 */
#ifndef RL_NOTIFY_H
#define RL_NOTIFY_H

/*
 * Send msg (e.g. "READY=1\nSTATUS=serving") to $NOTIFY_SOCKET, a path or an
 * abstract socket ("@name").  Returns 1 if sent, 0 if $NOTIFY_SOCKET is not
 * set, -1 on error (errno set).  Any thread.
 */
int notify_send(const char *msg);

#endif
