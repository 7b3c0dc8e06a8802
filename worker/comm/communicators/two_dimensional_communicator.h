#pragma once

// TwoDimensionalCommunicator is declared beside HierarchicalCommunicator, its sibling.
#include "worker/comm/communicators/hierarchical_communicator.h"
