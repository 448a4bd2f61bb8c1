/*
 * admin_store.c - the admin endpoints that ask the store (docs/admin.md):
 * /admin/counters and /admin/overrides.
 *
 * Thread: the connection's own, which waits for the store.
 */
#include <stdio.h>
#include <string.h>

#include "front/admin_priv.h"

int
admin_handle_counters(struct admin_server *s, struct MHD_Connection *conn,
    const struct config *cfg, const char *method)
{
	(void)s;
	(void)cfg;
	(void)method;
	return admin_error(conn, 404, "not_found", "no endpoint");
}

int
admin_handle_overrides(struct admin_server *s, struct MHD_Connection *conn,
    const struct config *cfg, const char *method, const char *body, size_t len)
{
	(void)s;
	(void)cfg;
	(void)method;
	(void)body;
	(void)len;
	return admin_error(conn, 404, "not_found", "no endpoint");
}
