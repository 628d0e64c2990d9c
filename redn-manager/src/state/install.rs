//! The install path of the module docs ([`Manager::install`]) and its undoing
//! ([`Manager::uninstall`]): the app rule, the definition, the bindings, the queue quota,
//! the verifier and the transactional install, each refusal a `ManagerError` naming what
//! was wrong.

use super::*;

impl Manager {
    /// `io.redn.Manager.InstallOffload`: the install path of the module docs.
    ///
    /// # Errors
    /// `NoSuchOffload`, `PolicyDenied`, `InvalidParameter`, `NoSuchRegion`,
    /// `QuotaExceeded` (`queues`), `VerifierRefused`, `NoDevice`.
    pub fn install(
        &mut self,
        client: u64,
        req: api::InstallOffload,
    ) -> Result<api::Installed, ManagerError> {
        let c = self.client(client)?;
        let app = self.app_of(c)?;
        let program =
            self.offloads
                .get(&req.offload)
                .ok_or_else(|| ManagerError::NoSuchOffload {
                    offload: req.offload.clone(),
                })?;
        if let Some(reason) = self.ban_refusal(&app.name, c.identity.uid) {
            return Err(policy_denied(reason));
        }
        if !app.allows_offload(&req.offload) {
            return Err(policy_denied(format!(
                "app {:?} may not install {:?} (policy allows: {})",
                app.name,
                req.offload,
                app.offloads.join(", ")
            )));
        }
        if let Some(k) = req.parameters.as_ref().and_then(|p| p.keys().next()) {
            return Err(ManagerError::InvalidParameter {
                parameter: format!("parameters.{k}"),
                reason: format!(
                    "offload {:?} takes no install-time parameters",
                    program.name
                ),
            });
        }
        let mut bindings = HashMap::new();
        let mut lens = HashMap::new();
        for b in &req.regions {
            let bad = |reason: String| ManagerError::InvalidParameter {
                parameter: format!("regions[{}]", b.name),
                reason,
            };
            let decl = program
                .regions
                .iter()
                .find(|d| d.name == b.name)
                .ok_or_else(|| {
                    bad(format!(
                        "offload {:?} has no region of that name",
                        program.name
                    ))
                })?;
            if !matches!(decl.role, RegionRole::Data { .. }) {
                return Err(bad(
                    "the response region is the remote client's, not bound by the app".into(),
                ));
            }
            let region = c
                .regions
                .get(&b.region)
                .ok_or(ManagerError::NoSuchRegion { region: b.region })?;
            let end = b.offset.checked_add(b.len).filter(|&e| e <= region.size);
            if end.is_none() || b.len < decl.min_len {
                return Err(bad(format!(
                    "offset {} + len {} must lie inside region {} ({} bytes) and len be at least {}",
                    b.offset, b.len, b.region, region.size, decl.min_len
                )));
            }
            let (offset, len) = (
                usize::try_from(b.offset).map_err(|_| bad("offset too large".into()))?,
                usize::try_from(b.len).map_err(|_| bad("len too large".into()))?,
            );
            if bindings
                .insert(
                    b.name.clone(),
                    RegionBinding::Local {
                        buffer: Arc::clone(&region.buffer),
                        offset,
                        len,
                        access: Access::ALL,
                    },
                )
                .is_some()
            {
                return Err(bad("bound twice".into()));
            }
            lens.insert(b.name.clone(), b.len);
        }
        if let Some(missing) = program
            .regions
            .iter()
            .find(|d| matches!(d.role, RegionRole::Data { .. }) && !bindings.contains_key(&d.name))
        {
            return Err(ManagerError::InvalidParameter {
                parameter: "regions".into(),
                reason: format!(
                    "region {:?} of {:?} is not bound",
                    missing.name, program.name
                ),
            });
        }
        let app_clients = self.app_clients(c, &app.name);
        let queues_held: usize = self
            .installed
            .values()
            .filter(|o| app_clients.contains(&o.client))
            .map(|o| o.installed.qps.len() + 1)
            .sum();
        let wanted = program.queues.len() + 1;
        let max_queues = u64::from(app.quota.max_queues.get());
        if (queues_held + wanted) as u64 > max_queues {
            return Err(ManagerError::QuotaExceeded {
                resource: "queues".into(),
                limit: max_queues,
                requested: (queues_held + wanted) as u64,
            });
        }
        let report = verify(program, &grants_for(app, program, &lens));
        if !report.accepted() {
            let mut rules: Vec<&str> = report.findings.iter().map(|f| f.rule.id()).collect();
            rules.dedup();
            self.refused_rules = rules.join(",");
            return Err(ManagerError::VerifierRefused {
                offload: program.name.clone(),
                log: report.log(),
            });
        }
        let program = program.clone();
        let app_name = app.name.clone();
        let app_matchers = app.matchers.clone();
        let app_limits = (app.client.rate_limit_kbps, app.client.wqes_per_second);
        let token = random_token().map_err(|e| ManagerError::NoDevice {
            reason: format!("no random token: {e}"),
        })?;
        let data_bindings = bindings.clone();
        let (parking, response) = self.parking_side()?;
        bindings.insert("response".to_owned(), response);
        let nic = Arc::clone(&self.nic);
        let parked = parking._qp.qpn();
        let installed = install(&self.nic, &program, &bindings, &mut |q| {
            nic.connect(q, parked)
        })
        .map_err(|e| no_device(&e))?;
        // Each of the install's queues is paced to the app's bandwidth; WQE rates are the
        // auditor's to count and, on a violation, to pace (see `crate::auditor`). A failure
        // drops `installed`, which releases everything.
        let limit = rate_limit((app_limits.0, WqeRate::Unlimited));
        if !limit.is_unlimited() {
            for q in &installed.qps {
                self.nic
                    .set_rate_limit(q.qpn, limit)
                    .map_err(|e| no_device(&e))?;
            }
        }
        let handle = self.fresh_id();
        let app_key = self.app_keys.key(&app_name, &app_matchers);
        let hex = token.to_hex();
        let at_install = self.sample(&program, &installed);
        self.installed.insert(
            handle,
            Offload {
                client,
                app: app_name,
                app_key,
                program,
                token,
                data_bindings,
                limit,
                installed,
                at_install,
                _parking: parking,
                remote: BTreeMap::new(),
                retired: (0, 0, 0),
                remote_terminated: 0,
                remote_banned: 0,
                token_issued: std::time::Instant::now(),
                arrivals: enforce::Arrivals::default(),
            },
        );
        Ok(api::Installed {
            handle,
            token: hex,
            endpoint: self.dataplane_endpoint.clone(),
        })
    }

    /// A parking queue pair with a response buffer, each object released if a later one
    /// fails (the handles drop).
    fn parking_side(&self) -> Result<(Parking, RegionBinding), ManagerError> {
        let pd = ProtectionDomain::alloc(&self.nic).map_err(|e| no_device(&e))?;
        let buffer = SharedBuffer::new(PARKING_RESPONSE_LEN);
        let key = RegisteredRegion::register(
            &pd,
            &buffer,
            0,
            PARKING_RESPONSE_LEN,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .map_err(|e| no_device(&e))?;
        let cq =
            CompletionQueue::create(&self.nic, CqConfig::counted(64)).map_err(|e| no_device(&e))?;
        // Room for a test run's triggers and the receives their responses land in.
        let mut cfg = QpConfig::new(pd.pdn(), cq.cqn());
        cfg.sq_bbs = 2 * enforce::MAX_TEST_RUN;
        cfg.rq_slots = enforce::MAX_TEST_RUN;
        let qp = QueuePair::create(&pd, &cq, &cq, cfg).map_err(|e| no_device(&e))?;
        let info = key.info();
        let binding = RegionBinding::Remote {
            addr: info.addr,
            rkey: redn_program::Rkey(info.lkey.0),
            len: info.len,
        };
        Ok((
            Parking {
                _qp: qp,
                sends: 0,
                _key: key,
                _cq: cq,
                _pd: pd,
            },
            binding,
        ))
    }

    /// `io.redn.Manager.Uninstall`.
    ///
    /// # Errors
    /// `NoSuchHandle` if the caller holds no such offload.
    pub fn uninstall(&mut self, client: u64, handle: u64) -> Result<(), ManagerError> {
        match self.installed.get(&handle) {
            Some(o) if o.client == client => {
                self.remove_offload(handle);
                self.release_unbound_adopted(client);
                Ok(())
            }
            _ => Err(ManagerError::NoSuchHandle { handle }),
        }
    }
}
