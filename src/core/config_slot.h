/*
 * config_slot.h - where a server keeps the config snapshot it serves: a
 * reload publishes a new one, and every request takes a reference to the
 * one published when it starts (config.h), so the rules never change under
 * a request in flight.  Every front end (HTTP, gRPC) keeps one.
 *
 * Any thread; the slot's lock is held only to swap or take a pointer.
 */
#ifndef RL_CONFIG_SLOT_H
#define RL_CONFIG_SLOT_H

#include <pthread.h>

#include "core/config.h"

struct config_slot {
	pthread_mutex_t lock;
	struct config *cfg; /* one reference, held by the slot */
};

/* Start with cfg (takes one reference). */
void config_slot_init(struct config_slot *s, struct config *cfg);
/* Publish cfg (takes one reference; drops the old snapshot's). */
void config_slot_set(struct config_slot *s, struct config *cfg);
/* The current snapshot, with one reference for the caller. */
struct config *config_slot_get(struct config_slot *s);
/* Drop the snapshot; the slot is then unusable. */
void config_slot_destroy(struct config_slot *s);

#endif
